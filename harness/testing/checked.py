"""Checked mode: catch callers that keep a replay's outputs past the next replay.

With CUDA graphs, the tensors a call returns alias graph memory and are valid only until the next call (vLLM's
contract). `CheckedModel` wraps a compiled model and keeps a weak reference to each returned tensor and a
private copy of its values; after each call it checks every earlier output the caller still holds, and raises
`OutputOverwrittenError`, naming the call that produced it, when its values changed. Costs one copy of every
output per call: for tests, not for serving.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch

from pieceworks.core import tensors_in

__all__ = ["CheckedModel", "OutputOverwrittenError"]


class OutputOverwrittenError(RuntimeError):
    """An output the caller still holds was overwritten by a later replay."""


class CheckedModel:
    def __init__(self, model: Callable[..., Any]) -> None:
        self.model = model
        self.calls = 0
        self._held: list[tuple[int, weakref.ref, torch.Tensor]] = []

    def check(self) -> None:
        """Raise if an earlier output that is still referenced no longer holds the values it was returned
        with."""
        alive = []
        for call, ref, copy in self._held:
            tensor = ref()
            if tensor is None:
                continue
            if not torch.equal(tensor, copy):
                raise OutputOverwrittenError(
                    f"an output of call #{call} (shape {tuple(tensor.shape)}) was "
                    f"overwritten by a later call: outputs are valid only until the next "
                    f"call. Fix: clone() outputs you keep"
                )
            alive.append((call, ref, copy))
        self._held = alive

    def __call__(self, *args: Any) -> Any:
        out = self.model(*args)
        self.calls += 1
        self.check()
        for t in tensors_in(out):
            self._held.append((self.calls, weakref.ref(t), t.clone()))
        return out
