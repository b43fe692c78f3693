"""The torch.compile door: `torch.compile(model, backend=pieceworks.Backend(config))`, or
`backend="pieceworks"` (`registered_backend`, which Dynamo finds through pyproject's `torch_dynamo_backends`
entry point: an installed pieceworks, imported or not).

Each FX graph Dynamo hands over is compiled piecewise (`compile_pieces`, compiled.py) and served by a
`Runtime` (runtime.py) that Dynamo's compiled code calls directly. Dynamo's guards and dynamic-shape marking
are the caller's business, and so are the input buffers: every replay checks the addresses of the inputs it
reads. The batch kind is read once per call, at this door (`pieceworks.is_uniform_decode()`), and handed
inward.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from .batch_kind import is_uniform_decode
from .compiled import compile_pieces
from .config import CompilationConfig, ConfigError
from .runtime import Runtime


class Backend:
    """A torch.compile backend: `torch.compile(model, backend=Backend(config), fullgraph=True)`.

    Each graph Dynamo hands over becomes a `Runtime` (with `lazy_capture`, each capture size is captured when
    first called), kept in `runtimes` in arrival order. Dynamo's guards and dynamic-shape marking are the
    caller's business; the caller owns the input buffers, so replays check their addresses. `config` is frozen
    and copied.
    """

    def __init__(self, config: CompilationConfig | None = None) -> None:
        self.config = own_config(config)
        self.runtimes: list[Runtime] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
        runtime = Runtime(compile_pieces(gm, self.config), self.config)
        self.runtimes.append(runtime)
        batch = runtime.compiled.batch

        def door(*args: Any) -> Any:  # what Dynamo's compiled code calls: the batch kind read once, here
            return runtime.run(args, None if batch is None else batch.read(args), is_uniform_decode(), False)

        return door


def own_config(config: CompilationConfig | None) -> CompilationConfig:
    """A frozen copy of `config` (the caller's is frozen too, so that editing it raises: config.py)."""
    if config is not None and not isinstance(config, CompilationConfig):
        raise TypeError(f"pieceworks needs a pieceworks.CompilationConfig, got {type(config).__name__}")
    return copy.deepcopy(config.freeze()) if config is not None else CompilationConfig().freeze()


def registered_backend(gm: torch.fx.GraphModule, example_inputs: list, options=None, mode=None) -> Any:
    """`backend="pieceworks"`: `options` are `CompilationConfig` fields; `mode` (Inductor's presets) is
    refused by name: pieceworks captures its own CUDA graphs (`cudagraph_mode`)."""
    if mode not in (None, "default"):
        raise ConfigError(
            f"torch.compile(mode={mode!r}) selects Inductor's presets, which pieceworks does not read. Fix: "
            "leave mode out; CompilationConfig fields go in options= ({'cudagraph_mode': 'FULL', ...})"
        )
    return Backend(CompilationConfig(**(options or {})))(gm, example_inputs)
