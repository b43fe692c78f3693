"""pieceworks: piecewise CUDA-graph compilation, the reference implementation.

Public API: `CompilationConfig`, `CUDAGraphMode`, `compile`, `Backend`, `split_graph`, `counters`; batch kinds
(batch_kind.py): `uniform_decode()` around a call marks a uniform decode batch,
`declare_graph_support(op, ...)` says what a CUDA graph around a splitting op may hold.

Public view for tools: `CompiledModel.runtime` (`Runtime`: `graph`, `mode`, `phase`, `pool`, `captured_sizes`,
`mode_for(uniform)`, `replay_for(n, uniform)`), `Runtime.graph` (`CompiledGraph`: `split_module`, `pieces`,
`build_seconds`, `cache_dir`), `Piece` (one piece and its facts), `ReplayPlan` / `FullGraph` (`batch`,
`graphs`, `steps`, `run`); the rules tools share with the runtime: `batch_of` (a call's batch size: dim 0 of
its tensor arguments, which must agree), `padded_size` (the captured size a batch pads to), `compile_target`
(the compiled size or range serving a batch), `unpad` (outputs cut back to the batch), `op_names` (an FX
target's op names, as splitting ops match them), `tensors_in` (the tensors of a nested value), `pool_bytes` (a
graph pool's bytes), `cache_key_factors` (what keys the compile cache besides graph and config).

The name "pieceworks" is registered as a torch.compile backend:
`torch.compile(model, backend="pieceworks", options={"splitting_ops": [...], ...})`.
"""

from __future__ import annotations

import torch

from .api import CompiledModel, GlobalHookError, InputError, StateReplacedError, batch_of, compile
from .backend import Backend, CompiledGraph
from .batch_kind import GraphSupport, declare_graph_support, is_uniform_decode, uniform_decode
from .config import CompilationConfig, ConfigError, CUDAGraphMode, default_capture_sizes
from .counters import CompilationCounter, counters
from .cudagraph import pool_bytes
from .dispatch import BatchSizeError, compile_target, padded_size
from .key import cache_key_factors
from .padding import unpad
from .piece import Piece
from .plan import FullGraph, ReplayPlan
from .runtime import CaptureMismatchError, Phase, Runtime
from .split import op_names, split_graph
from .values import tensors_in

__all__ = ["Backend", "BatchSizeError", "CaptureMismatchError", "CompilationConfig", "CompilationCounter",
           "CompiledGraph", "CompiledModel", "ConfigError", "CUDAGraphMode", "FullGraph", "GlobalHookError",
           "GraphSupport", "InputError", "Phase", "Piece", "ReplayPlan", "Runtime", "StateReplacedError",
           "batch_of", "cache_key_factors", "compile", "compile_target", "counters", "declare_graph_support",
           "default_capture_sizes", "is_uniform_decode", "op_names", "padded_size", "pool_bytes",
           "split_graph", "tensors_in", "uniform_decode", "unpad"]

__version__ = "0.1.0"


def _registered_backend(gm: torch.fx.GraphModule, example_inputs: list, options: dict | None = None):
    """`backend="pieceworks"`: `options` are `CompilationConfig` fields."""
    return Backend(CompilationConfig(**(options or {})))(gm, example_inputs)


if "pieceworks" not in torch._dynamo.list_backends(exclude_tags=()):
    torch._dynamo.register_backend(_registered_backend, name="pieceworks")
