"""pieceworks: piecewise CUDA-graph compilation, the reference implementation.

The user's API: `compile(model, config)` returns a `CompiledModel` (pieceworks.model: call it as the model,
`capture()` its CUDA graphs); `CompilationConfig` and `CUDAGraphMode` configure it; `Backend` (or
`backend="pieceworks"`) is the torch.compile door; `uniform_decode()` around a call marks a uniform decode
batch, and `declare_graph_support(op, ...)` says what a CUDA graph around a splitting op may hold; `counters`
count traces, compiles and captures; the errors each name the problem and the fix.

The technique's own names, for engines and tools, are in `pieceworks.core`.
"""

from __future__ import annotations

from .backend import Backend
from .batch_kind import GraphSupport, declare_graph_support, is_uniform_decode, uniform_decode
from .config import CompilationConfig, ConfigError, CUDAGraphMode, default_capture_sizes
from .counters import CompilationCounter, counters
from .cudagraph import CaptureMismatchError
from .model import CompiledModel, GlobalHookError, InputError, StateReplacedError, batch_of, compile
from .piece import BatchSizeError
from .split import split_graph

# compiling and serving a model, and configuring it; the torch.compile door
__all__ = ["compile", "CompiledModel", "CompilationConfig", "CUDAGraphMode", "Backend"]
# the batch kind of a call, and what a CUDA graph around a splitting op may hold; the split itself
__all__ += ["uniform_decode", "is_uniform_decode", "declare_graph_support", "GraphSupport", "split_graph"]
# what happened; a call's batch size; the capture sizes a config takes by default
__all__ += ["counters", "CompilationCounter", "batch_of", "default_capture_sizes"]
# the errors, each naming the problem and the fix
__all__ += ["BatchSizeError", "CaptureMismatchError", "ConfigError", "InputError"]
__all__ += ["GlobalHookError", "StateReplacedError"]

__version__ = "0.1.0"
