"""The technique's public names: what an engine builds on, and all that pieceworks' own model layer
(`pieceworks.model`) and tools use of it.

- Compile: `compile_pieces(fx_graph_module, config)` splits a Dynamo FX graph at its splitting ops and
  compiles every other piece (`CompiledPieces`: the stitching module, the `Piece`s, build seconds), or what
  `split_pieces` (the split and its analysis, nothing compiled) returned; `op_names`
  (an FX target's op names, as splitting ops match them); `compile_target` (the compiled size or range serving
  a batch); `BatchSizeError`.
- Cache and key: `CompileCache`, `cache_key`, `software_factors`, `inductor_config_factors`, `key_change` and
  the other factors' helpers the serving record keys itself with.
- Serve: `Runtime` (replays per padded size and batch kind; `Phase`, `CapturePhase`), `ReplayPlan` and
  `FullReplay` (the replays), `padded_size` (the captured size a batch pads to), `StaticInputs` (the buffers
  a replay reads), `batched_outputs` and `unpad` (outputs cut back to the batch), `pool_bytes` (a CUDA graph
  pool's bytes), `is_uniform_decode` (the batch kind the caller declared).
- Values: `tensors_in`, `tree_map`, `cycle_rows`; `torch_compat`, the one module that reaches torch's
  private APIs (feature-detected, one `TorchCompatError` naming what is missing).
"""

from __future__ import annotations

from . import _compat as torch_compat
from .backend import own_config
from .batch_kind import is_uniform_decode
from .cache import CompileCache, file_sha256
from .compiled import CompiledPieces, compile_pieces, split_pieces
from .config import CompilationConfig, ConfigError, CUDAGraphMode
from .counters import counters, log
from .cudagraph import pool_bytes
from .key import (
    UnkeyableConfigError,
    as_json,
    cache_key,
    describe_change,
    digest,
    inductor_config_factors,
    key_change,
    portable,
    software_factors,
)
from .padding import StaticInputs, batched_outputs, padded_size, unpad
from .piece import BatchSizeError, Piece, compile_target
from .plan import FullReplay, ReplayPlan
from .progress import progress
from .runtime import CapturePhase, Phase, Runtime
from .split import op_names
from .values import cycle_rows, tensors_in, tree_map
