"""Compiling the pieces: each distinct (piece fingerprint, compile target) once, from the cache when it can.

`PieceCompiler.compile(piece)` returns the piece with its `runnables` filled: one symbolic compile per compile
range and one static compile per compile size. A target is served from this process's memo when an identical
piece (same fingerprint) was already served, else from the on-disk cache, else by compiling and storing it.
Across processes a miss is compiled under that entry's lock, so concurrent cold starts share the work: one
compiles, the others wait and load. Static compiles specialise to one batch size: their example inputs are empty
tensors of the traced metadata with the batch size put in (no model runs for them).

The compilers: TorchInductor through `standalone_compile` (reached through `_compat`), or "eager" (the piece's own
GraphModule, for tests whose subject is not Inductor). A compiled piece takes its inputs positionally (ints for
SymInts) and returns what its GraphModule returns.

Counters: `num_backend_compilations` counts every (piece, compile target) served, loads and shared pieces
included (vLLM's meaning: 13 for a 12-layer ToyLlama with one range, cold or warm); fresh compiles are
`num_inductor_compiles` / `num_eager_compiles`, loads `num_compiled_artifacts_loaded`, pieces served by an
identical piece `num_shared_piece_compiles`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.fx

from . import _compat
from .cache import CompileCache
from .config import CompilationConfig
from .counters import counters
from .dispatch import find_range
from .key import entry_claim, entry_name
from .piece import Piece, Target
from .values import tensors_in

__all__ = ["PieceCompiler", "computes_tensors", "static_example_args", "compile_inductor", "save_artifact",
           "load_artifact", "inductor_cache_dir"]

log = logging.getLogger("pieceworks")


class PieceCompiler:
    """Compiles (or loads) each distinct (piece fingerprint, target) of one graph once. `compiled`, `loaded` and
    `shared` count what it did, for the log line."""

    def __init__(self, config: CompilationConfig, cache: CompileCache | None) -> None:
        self.config = config
        self.cache = cache
        self.done: dict[tuple[str, Target], Callable[..., Any]] = {}
        self.compiled = self.loaded = self.shared = 0

    def compile(self, piece: Piece) -> Piece:
        """`piece` with code for every compile range and size. A piece with data-dependent sizes gets no static
        compile (it would bake in one call's sizes): its range code serves the compile sizes."""
        config = self.config
        runnables: dict[Target, Callable[..., Any]] = {}
        for lo_hi in config.ranges():
            runnables[lo_hi] = self.get(piece, lo_hi, piece.example_args)
        if piece.unbacked_symbols and config.compile_sizes:
            log.info("pieceworks: piece %s has data-dependent sizes (%s): compile_sizes %s are served by the code "
                     "compiled for their ranges", piece.submod_name, ", ".join(piece.unbacked_symbols),
                     config.compile_sizes)
        for size in config.compile_sizes:
            runnables[size] = runnables[find_range(config.ranges(), size)] if piece.unbacked_symbols else \
                self.get(piece, size, static_example_args(piece.example_args, size))
        return dataclasses.replace(piece, runnables=runnables)

    def get(self, piece: Piece, target: Target, example_args: Sequence[Any]) -> Callable[..., Any]:
        counters.num_backend_compilations += 1
        key = (piece.fingerprint, target)
        if key in self.done:
            self.shared += 1
            counters.num_shared_piece_compiles += 1
            return self.done[key]
        as_traced = not computes_tensors(piece)
        if self.cache is None or as_traced:
            fn = self._compile(piece.graph, isinstance(target, int), example_args, as_traced)[0]
        else:
            chosen = "cpp_cache_precompile_headers" in self.config.inductor_compile_config
            with inductor_cache_dir(self.cache.inductor_dir, precompiled_headers=chosen):
                fn = self._get_cached(piece, target, example_args)
        self.done[key] = fn
        return fn

    def _get_cached(self, piece: Piece, target: Target, example_args: Sequence[Any]) -> Callable[..., Any]:
        cache = self.cache
        name = entry_name(piece.fingerprint, target)
        claim = entry_claim(piece.fingerprint, target, list(example_args))
        load = lambda path: load_artifact(path, piece.graph)  # noqa: E731
        fn, seen = cache.load(name, load, claim)
        if fn is None:
            with cache.entry_lock(name):
                # Another process may have stored it while we looked or waited; an entry we already rejected is
                # skipped, not tried (nor reported) twice.
                fn, _ = cache.load(name, load, claim, skip=seen)
                if fn is None:
                    fn, artifact = self._compile(piece.graph, isinstance(target, int), example_args)
                    if artifact is not None:
                        cache.store(name, lambda path: save_artifact(artifact, path), claim)
                    return fn
        self.loaded += 1
        return fn

    def _compile(self, graph: torch.fx.GraphModule, static: bool, example_args: Sequence[Any],
                 as_traced: bool = False) -> tuple[Callable[..., Any], Any]:
        self.compiled += 1
        if self.config.compiler == "eager" or as_traced:
            counters.num_eager_compiles += 1
            return graph.forward, None
        counters.num_inductor_compiles += 1
        return compile_inductor(graph, list(example_args), static=static,
                                inductor_config=self.config.inductor_compile_config)


def computes_tensors(piece: Piece) -> bool:
    """Whether a piece returns a tensor or writes one of its inputs in place. One that does neither (size checks a
    split leaves alone in a piece, work whose results nothing reads) gives Inductor nothing to generate: its compile
    saves no artifact, so it would be compiled again on every warm start. Such a piece runs as traced (the eager
    compiler) and is never cached."""
    output = next(n for n in piece.graph.graph.nodes if n.op == "output")
    return any(tensors_in(_compat.example_value(n)) for n in output.all_input_nodes) or bool(piece.mutated_inputs)


def static_example_args(example_args: Sequence[Any], size: int) -> list[Any]:
    """Real example inputs at batch `size`: an empty tensor of each traced tensor's dtype, device, sizes and strides
    with every symbol set to `size` (static compiles read metadata, never values), ints for SymInts."""
    found = []
    for value in example_args:
        if isinstance(value, torch.SymInt):
            value = _compat.evaluate_at(value, size)
        elif isinstance(value, torch.Tensor):
            shape = [_compat.evaluate_at(d, size) for d in value.shape]
            stride = [_compat.evaluate_at(d, size) for d in value.stride()]
            value = torch.empty_strided(shape, stride, dtype=value.dtype, device=value.device)
        found.append(value)
    return found


def _returns_tuple(gm: torch.fx.GraphModule) -> bool:
    return isinstance(next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0], (tuple, list))


def _adapt_outputs(fn: Callable[..., Any], tuple_output: bool) -> Callable[..., Any]:
    """Give callers exactly what the piece's GraphModule returns (Inductor returns a list for a tuple output)."""
    if tuple_output:
        return lambda *args: tuple(fn(*args))

    def call_single(*args: Any) -> Any:
        out = fn(*args)
        return out[0] if isinstance(out, (list, tuple)) else out

    return call_single


def compile_inductor(gm: torch.fx.GraphModule, example_args: list[Any], *, static: bool,
                     inductor_config: dict[str, Any]) -> tuple[Callable[..., Any], Any]:
    """Compile `gm` with Inductor; returns `(callable, artifact)`. `static=False`: `example_args` are the trace's
    FakeTensors/SymInts and the batch size stays symbolic; `static=True`: real values of one batch size.

    "from_graph" reads the shape environment off the FakeTensors the piece returns; a piece that returns no tensor
    (one that only writes its inputs) has none, and then Dynamo's tracing context holds the same one."""
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0]
    returned = output if isinstance(output, (tuple, list)) else [output]
    symbolic = "from_graph" if any(
        isinstance(n, torch.fx.Node) and hasattr(_compat.example_value(n), "fake_mode") for n in returned
    ) else "from_tracing_context"
    artifact = _compat.standalone_compile(gm, list(example_args),
                                          dynamic_shapes="from_example_inputs" if static else symbolic,
                                          options={"config_patches": dict(inductor_config)})
    return _adapt_outputs(artifact, _returns_tuple(gm)), artifact


def save_artifact(artifact: Any, path: str) -> None:
    """Write `artifact` to `path` (binary format). Raises if the artifact cannot be serialised."""
    artifact.save(path=path, format="binary")


def load_artifact(path: str, gm: torch.fx.GraphModule) -> Callable[..., Any]:
    """Load an artifact saved by `save_artifact`; raises on any problem (another torch build, bad bytes).

    Loads run in this process (Inductor's `compile_threads` is 1 for their duration): an artifact carries its
    compiled kernels, so a load builds none, and the pool of compile workers Inductor would otherwise start costs
    a warm process seconds of start-up for nothing."""
    with _compat.inductor_config().patch(compile_threads=1):
        artifact = _compat.load_artifact(path)
    return _adapt_outputs(artifact, _returns_tuple(gm))


@contextlib.contextmanager
def inductor_cache_dir(path: str | None, *, precompiled_headers: bool = False) -> Iterator[None]:
    """Point Inductor's on-disk cache (`TORCHINDUCTOR_CACHE_DIR`) at `path` for the block, then restore it; `None`
    leaves everything alone. With a `path`, C++ kernels are built without Inductor's precompiled header (unless
    `precompiled_headers`): Inductor keeps it outside `TORCHINDUCTOR_CACHE_DIR` and rebuilds it before it looks for
    a kernel's library, so a warm start on a new host would spend a g++ run on it. Compile and load run under the
    same setting, so library names (digests of the build command) match. Not thread-safe (the environment is
    process-wide), like the rest of a compile."""
    if path is None:
        yield
        return
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    config = _compat.inductor_config()
    headers = {} if precompiled_headers or not hasattr(config, "cpp_cache_precompile_headers") else \
        {"cpp_cache_precompile_headers": False}
    try:
        with config.patch(**headers):
            yield
    finally:
        if before is None:
            del os.environ["TORCHINDUCTOR_CACHE_DIR"]
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before
