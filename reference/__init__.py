"""pieceworks: piecewise CUDA-graph compilation, the reference implementation.

The user's API: `compile(model, config)` returns a `CompiledModel` (pieceworks.model: call it as the model,
`capture()` its CUDA graphs); `CompilationConfig` and `CUDAGraphMode` configure it; `Backend` (or
`backend="pieceworks"`) is the torch.compile door; `uniform_decode()` around a call marks a uniform decode
batch, and `declare_graph_support(op, ...)` says what a CUDA graph around a splitting op may hold; `counters`
count traces, compiles and captures; the errors each name the problem and the fix.

The technique's own names, for engines and tools, are in `pieceworks.core`.
"""

from __future__ import annotations

import torch

from .backend import Backend, registered_backend
from .batch_kind import GraphSupport, declare_graph_support, is_uniform_decode, uniform_decode
from .config import CompilationConfig, ConfigError, CUDAGraphMode, default_capture_sizes
from .counters import CompilationCounter, counters
from .cudagraph import CaptureMismatchError
from .dispatch import BatchSizeError
from .model import CompiledModel, GlobalHookError, InputError, StateReplacedError, batch_of, compile
from .split import split_graph

__all__ = [
    "Backend",
    "BatchSizeError",
    "CaptureMismatchError",
    "CompilationConfig",
    "CompilationCounter",
    "CompiledModel",
    "ConfigError",
    "CUDAGraphMode",
    "GlobalHookError",
    "GraphSupport",
    "InputError",
    "StateReplacedError",
    "batch_of",
    "compile",
    "counters",
    "declare_graph_support",
    "default_capture_sizes",
    "is_uniform_decode",
    "split_graph",
    "uniform_decode",
]

__version__ = "0.1.0"

if "pieceworks" not in torch._dynamo.list_backends(exclude_tags=()):
    torch._dynamo.register_backend(registered_backend, name="pieceworks")
