"""Static input buffers and padding: the caller-side half of CUDA-graph replay.

`StaticInputs` holds one buffer of the largest captured size per tensor argument; batch n reads the slices
`buffer[:n]`, so the address a graph captured never moves. A call of batch b <= n copies the b real rows in
(one copy per argument); rows b..n-1 keep whatever valid rows they held (the first call's rows, repeated, or
rows of an earlier call), never uninitialised memory: a token id there is always a valid index. The model must
treat rows independently (as every batched inference model does), so padded rows cannot change real ones.
Memory: one max-size copy of each input. Not thread-safe.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from .values import cycle_rows, tree_map

__all__ = ["StaticInputs", "unpad"]


class StaticInputs:
    def __init__(self, example_args: Sequence[Any], max_size: int) -> None:
        self.buffers: list[Any] = []
        for a in example_args:
            self.buffers.append(cycle_rows(a, max_size).contiguous() if isinstance(a, torch.Tensor) else a)
        self._views: dict[int, list[Any]] = {}

    def views(self, n: int) -> list[Any]:
        """The arguments at batch n: `buffer[:n]` for tensors (memoised views), other values as they are."""
        views = self._views.get(n)
        if views is None:
            views = [b[:n] if isinstance(b, torch.Tensor) else b for b in self.buffers]
            self._views[n] = views
        return views

    def load(self, args: Sequence[Any], batch: int, n: int) -> list[Any]:
        """Copy `args` (batch `batch`) into the buffers; return the arguments at padded batch n."""
        for buffer, a in zip(self.buffers, args):
            if isinstance(a, torch.Tensor):
                buffer[:batch].copy_(a, non_blocking=True)
        return self.views(n)


def unpad(value: Any, batch: int, n: int) -> Any:
    """`value` with every tensor whose dim 0 is the padded size n cut back to the real batch."""
    return tree_map(
        lambda v: v[:batch] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == n else v, value
    )
