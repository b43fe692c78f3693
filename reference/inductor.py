"""Compiling one piece: TorchInductor through `torch._inductor.standalone_compile`, or the eager 'compiler'.

A compiled piece is a callable that takes the piece's inputs positionally (ints for SymInts) and returns what
the piece's GraphModule returns (a tuple, or a bare value where the piece has one output). Nothing here patches
torch; `standalone_compile` and `CompiledArtifact.save/load` are reached through `_compat`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any

import torch.fx

from . import _compat

__all__ = ["compile_inductor", "compile_eager", "save_artifact", "load_artifact", "returns_tuple", "inductor_cache_dir"]


def returns_tuple(gm: torch.fx.GraphModule) -> bool:
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    return isinstance(output.args[0], (tuple, list))


def _adapt_outputs(fn: Callable[..., Any], tuple_output: bool) -> Callable[..., Any]:
    """Give callers exactly what the piece's GraphModule returns (Inductor returns a list for a tuple output)."""
    if tuple_output:

        def call_tuple(*args: Any) -> tuple:
            return tuple(fn(*args))

        return call_tuple

    def call_single(*args: Any) -> Any:
        out = fn(*args)
        return out[0] if isinstance(out, (list, tuple)) else out

    return call_single


def _symbolic_source(gm: torch.fx.GraphModule) -> str:
    """Where standalone_compile finds the trace's shape environment.

    "from_graph" reads it off the FakeTensors the piece returns. A piece that returns no tensor (one that only
    writes to its inputs) has none to read; inside the backend call, Dynamo's tracing context holds the same one.
    """
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    values = output.args[0] if isinstance(output.args[0], (tuple, list)) else [output.args[0]]
    for node in values:
        if isinstance(node, torch.fx.Node) and hasattr(_compat.example_value(node), "fake_mode"):
            return "from_graph"
    return "from_tracing_context"


def compile_inductor(
    gm: torch.fx.GraphModule, example_args: list[Any], *, static: bool, inductor_config: dict[str, Any]
) -> tuple[Callable[..., Any], Any]:
    """Compile `gm` with Inductor. Returns `(callable, artifact)`; `artifact` can be saved.

    `static=False`: `example_args` are the FakeTensors/SymInts of the trace, the batch size stays symbolic.
    `static=True`: `example_args` are real tensors and ints of one batch size, which the code is specialised to.
    """
    artifact = _compat.standalone_compile(
        gm,
        list(example_args),
        dynamic_shapes="from_example_inputs" if static else _symbolic_source(gm),
        options={"config_patches": dict(inductor_config)},
    )
    return _adapt_outputs(artifact, returns_tuple(gm)), artifact


def compile_eager(gm: torch.fx.GraphModule) -> Callable[..., Any]:
    """The eager 'compiler': the piece's own GraphModule, for tests whose subject is not Inductor."""
    return gm.forward


def save_artifact(artifact: Any, path: str) -> None:
    """Write `artifact` to `path` (binary format). Raises if the artifact cannot be serialised."""
    artifact.save(path=path, format="binary")


def load_artifact(path: str, gm: torch.fx.GraphModule) -> Callable[..., Any]:
    """Load an artifact saved by `save_artifact`. Raises on any problem (wrong torch build, bad bytes).

    The load runs in this process (Inductor's `compile_threads` is 1 for its duration, then restored): an artifact
    carries its compiled kernels, so loading builds none, and the pool of compile workers Inductor would otherwise
    start for it made a warm process on the H100 take 23.9 s instead of 13.3 s, its first call unchanged (3.4-3.8
    against 3.5-4.0 s; results/README.md).
    """
    with _compat.inductor_config().patch(compile_threads=1):
        artifact = _compat.load_artifact(path)
    return _adapt_outputs(artifact, returns_tuple(gm))


@contextlib.contextmanager
def inductor_cache_dir(path: str | None, *, precompiled_headers: bool = False) -> Iterator[None]:
    """Point Inductor's on-disk cache (`TORCHINDUCTOR_CACHE_DIR`, read by Inductor whenever it needs the folder)
    at `path` for the block, then restore the variable. `None`: leave everything alone.

    With a `path`, C++ kernels are also built without Inductor's precompiled header (unless
    `precompiled_headers`): Inductor keeps that header in its default folder, outside `TORCHINDUCTOR_CACHE_DIR`,
    and rebuilds it before it looks for a kernel's library, so a warm start on a new host would spend a full g++
    run on it although every library is there. Compile and load run under the same setting, so that the library
    names (digests of the build command) match. Not thread-safe (the environment is process-wide), like the rest of
    a compile.
    """
    if path is None:
        yield
        return
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    config = _compat.inductor_config()
    patch = contextlib.nullcontext()
    if not precompiled_headers and hasattr(config, "cpp_cache_precompile_headers"):
        patch = config.patch(cpp_cache_precompile_headers=False)
    try:
        with patch:
            yield
    finally:
        if before is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before
