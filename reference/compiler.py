"""Compiling the pieces: each distinct (piece fingerprint, compile target) once, from the cache when it can.

`PieceCompiler.compile(piece)` returns the piece with its `runnables` filled: one symbolic compile per compile
range and one static compile per compile size. A target is served from this process's memo when an identical
piece (same fingerprint) was already served, else from the on-disk cache, else by compiling and storing it.
Across processes a miss is compiled under that entry's lock, so concurrent cold starts share the work: one
compiles, the others wait and load. Static compiles specialise to one batch size: their example inputs are
empty tensors of the traced metadata with the batch size put in (no model runs for them).

The compilers: TorchInductor through `standalone_compile` (reached through `_compat`), or "eager" (the piece's
own GraphModule, for tests whose subject is not Inductor). A compiled piece takes its inputs positionally
(ints for SymInts) and returns what its GraphModule returns. Inductor's probe of the CPU's vector ISAs (about
1 s a process) runs once per CPU and torch build: its result is kept in the cache (`known_cpu_isa`).

Counters: `num_backend_compilations` counts every (piece, compile target) served, loads and shared pieces
included (vLLM's meaning: 13 for a 12-layer ToyLlama with one range, cold or warm); fresh compiles are
`num_inductor_compiles` / `num_eager_compiles`, loads `num_compiled_artifacts_loaded`, pieces served by an
identical piece `num_shared_piece_compiles`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import os
import platform
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import torch

from . import _compat
from .cache import CompileCache, atomic_write, read_json_dict
from .config import CompilationConfig
from .counters import counters, log
from .key import digest, entry
from .piece import Piece, Target, find_range
from .values import tensors_in


class PieceCompiler:
    """Compiles (or loads) each distinct (piece fingerprint, target) of one graph once. `compiled`,
    `loaded` and `shared` count what it did, for the log line; `seconds` says where its time went ("load":
    reading and loading artifacts, misses included; "compile": compiling)."""

    def __init__(self, config: CompilationConfig, cache: CompileCache | None) -> None:
        self.config, self.cache = config, cache
        self.done: dict[tuple[str, Target], Callable[..., Any]] = {}
        self.compiled = self.loaded = self.shared = 0
        self.seconds = {"load": 0.0, "compile": 0.0}

    def compile(self, piece: Piece) -> Piece:
        """`piece` with code for every compile range and size. A piece with data-dependent sizes gets no
        static compile (it would bake in one call's sizes): its range code serves the compile sizes."""
        ranges, sizes = self.config.ranges(), cast(list[int], self.config.compile_sizes)  # ints once built
        runnables: dict[Target, Callable[..., Any]] = {lo_hi: self.get(piece, lo_hi) for lo_hi in ranges}
        if not piece.unbacked_symbols:
            runnables |= {size: self.get(piece, size) for size in sizes}
        elif sizes:
            what = f"piece {piece.submod_name} has data-dependent sizes ({', '.join(piece.unbacked_symbols)})"
            log.info("pieceworks: %s: compile_sizes %s are served by the code of their ranges", what, sizes)
            runnables |= {size: runnables[cast(Target, find_range(ranges, size))] for size in sizes}
        return dataclasses.replace(piece, runnables=runnables)

    def get(self, piece: Piece, target: Target) -> Callable[..., Any]:
        """The code for `piece` at `target`: compiled for a range on the trace's values, for a size on
        `static_example_args`."""
        counters.num_backend_compilations += 1
        key = (piece.fingerprint, target)
        if key in self.done:
            self.shared += 1
            counters.num_shared_piece_compiles += 1
            return self.done[key]
        # A size is compiled for real inputs of that size; a range, for the trace's symbolic values.
        args = piece.example_args
        example_args = static_example_args(args, target) if isinstance(target, int) else list(args)
        fn = None  # from the cache where it serves this piece, else compiled here
        if self.cache is not None and computes_tensors(piece):
            options, inductor_dir = self.config.inductor_compile_config, self.cache.inductor_dir
            try:
                isa_record = os.path.join(self.cache.directory, "cpu-isa.json")
                with inductor_cache_dir(inductor_dir, options), known_cpu_isa(isa_record):
                    fn = self._get_cached(self.cache, piece, target, example_args)
            except Exception as exc:  # Inductor could not write its files into the cache (a full disk)
                if inductor_dir is None or (error := os_error_of(exc)) is None:
                    raise
                self.cache.mark_read_only(error)  # one WARNING; every compile from here on is uncached
        self.done[key] = fn if fn is not None else self._compile(piece, target, example_args)[0]
        return self.done[key]

    def _get_cached(
        self, cache: CompileCache, piece: Piece, target: Target, example_args: list[Any]
    ) -> Callable[..., Any]:
        name, claim = entry(piece.fingerprint, target, example_args)
        load = lambda path: load_artifact(path, piece.fx_graph)  # noqa: E731
        start = time.perf_counter()
        fn, seen = cache.load(name, load, claim)
        if fn is None:
            with cache.entry_lock(name):
                # Another process may have stored it while we looked or waited; an entry we already rejected
                # is skipped, not tried (nor reported) twice.
                fn, _ = cache.load(name, load, claim, skip=seen)
                if fn is None:
                    self.seconds["load"] += time.perf_counter() - start
                    fn, artifact = self._compile(piece, target, example_args)
                    if cache.store(name, lambda path: artifact.save(path=path, format="binary"), claim):
                        counters.num_compiled_artifacts_saved += 1
                        counters.num_cache_entries_updated += 1
                    return fn
        self.seconds["load"] += time.perf_counter() - start
        self.loaded += 1
        counters.num_compiled_artifacts_loaded += 1
        return fn

    def _compile(self, piece: Piece, target: Target, args: list[Any]) -> tuple[Callable[..., Any], Any]:
        """Compile `piece` afresh: as traced (the eager compiler, or a piece with nothing for Inductor),
        else with Inductor."""
        self.compiled += 1
        if self.config.compiler == "eager" or not computes_tensors(piece):
            counters.num_eager_compiles += 1
            return piece.fx_graph.forward, None
        counters.num_inductor_compiles += 1
        start = time.perf_counter()
        static, options = isinstance(target, int), self.config.inductor_compile_config
        result = compile_inductor(piece.fx_graph, args, static=static, inductor_config=options)
        self.seconds["compile"] += time.perf_counter() - start
        return result


def os_error_of(exc: BaseException | None) -> OSError | None:
    """The `OSError` of a folder that cannot be written (full, read-only, not ours) that `exc` is or was
    raised from (Inductor wraps its errors), or None."""
    while exc is not None and not isinstance(exc, OSError):
        exc = exc.__cause__ or exc.__context__
    full_or_not_ours = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES)
    return exc if exc is not None and exc.errno in full_or_not_ours else None


def computes_tensors(piece: Piece) -> bool:
    """Whether a piece returns a tensor or writes one of its inputs in place. One that does neither (size
    checks a split leaves alone in a piece, work whose results nothing reads) gives Inductor nothing to
    generate: its compile saves no artifact, so it would be compiled again on every warm start. Such a
    piece runs as traced (the eager compiler) and is never cached."""
    returned = piece.fx_graph.graph.output_node().all_input_nodes
    return any(tensors_in(_compat.example_value(n)) for n in returned) or bool(piece.mutated_inputs)


def static_example_args(example_args: Sequence[Any], size: int) -> list[Any]:
    """Real example inputs at batch `size`: an empty tensor of each traced tensor's dtype, device, sizes
    and strides with every symbol set to `size` (static compiles read metadata, never values), ints for
    SymInts."""

    def at_size(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            shape, stride = ([at_size(d) for d in dims] for dims in (value.shape, value.stride()))
            return torch.empty_strided(shape, stride, dtype=value.dtype, device=value.device)
        return _compat.evaluate_at(value, size) if isinstance(value, torch.SymInt) else value

    return [at_size(value) for value in example_args]


def _adapt_outputs(fn: Callable[..., Any], gm: torch.fx.GraphModule) -> Callable[..., Any]:
    """Give callers exactly what `gm` returns (Inductor returns a list for a tuple output)."""
    tuple_output = isinstance(gm.graph.output_node().args[0], (tuple, list))

    def call(*args: Any) -> Any:
        out = fn(*args)
        return tuple(out) if tuple_output else (out[0] if isinstance(out, (list, tuple)) else out)

    return call


def compile_inductor(
    gm: torch.fx.GraphModule, example_args: list[Any], *, static: bool, inductor_config: dict[str, Any]
) -> tuple[Callable[..., Any], Any]:
    """Compile `gm` with Inductor; returns `(callable, artifact)`. `static=False`: `example_args` are the
    trace's FakeTensors/SymInts and the batch size stays symbolic; `static=True`: real values of one batch
    size.

    "from_graph" reads the shape environment off the FakeTensors the piece returns; a piece that returns no
    tensor (one that only writes its inputs) has none, and then Dynamo's tracing context holds the same
    one."""
    returned = [_compat.example_value(n) for n in gm.graph.output_node().all_input_nodes]
    symbolic = "from_graph" if _compat.fake_mode_of(returned) is not None else "from_tracing_context"
    shapes, options = "from_example_inputs" if static else symbolic, {"config_patches": dict(inductor_config)}
    artifact = _compat.standalone_compile(gm, list(example_args), dynamic_shapes=shapes, options=options)
    return _adapt_outputs(artifact, gm), artifact


def load_artifact(path: str, gm: torch.fx.GraphModule) -> Callable[..., Any]:
    """Load an artifact `compile_inductor` made, saved in the binary format (`PieceCompiler` saves it);
    raises on any problem (another torch build, bad bytes).

    Loads run in this process (Inductor's `compile_threads` is 1 for their duration): an artifact carries
    its compiled kernels, so a load builds none, and the pool of compile workers Inductor would otherwise
    start costs a warm process seconds of start-up for nothing. A load whose code Inductor's own cache
    lacked writes it out again and builds what it calls (`counters.num_kernel_rebuilds` says when): counted
    and logged with the artifact's path."""
    events = _compat.inductor_events()
    before = events["fxgraph_lookup_write_file"]
    with _compat.inductor_config().patch(compile_threads=1):
        artifact = _compat.load_artifact(path)
    if rebuilt := events["fxgraph_lookup_write_file"] - before:
        counters.num_kernel_rebuilds += rebuilt
        why = "written out and built again: Inductor's own cache did not hold it"
        log.info("pieceworks: %s loaded, the code of %d graphs %s", path, rebuilt, why)
    return _adapt_outputs(artifact, gm)


@contextlib.contextmanager
def inductor_cache_dir(path: str | None, options: Mapping[str, Any]) -> Iterator[None]:
    """Point Inductor's on-disk cache (`TORCHINDUCTOR_CACHE_DIR`) at `path` for the block, then restore it;
    `None` leaves everything alone. With a `path`, C++ kernels are built without Inductor's precompiled
    header (unless `options`, the config's `inductor_compile_config`, sets `cpp_cache_precompile_headers`):
    Inductor keeps it outside `TORCHINDUCTOR_CACHE_DIR` and rebuilds it before it looks for a kernel's
    library, so a warm start on a new host would spend a g++ run on it. Compile and load run under the same
    setting, so library names (digests of the build command) match. Not thread-safe (the environment is
    process-wide), like the rest of a compile."""
    if path is None:
        yield
        return
    config = _compat.inductor_config()
    kept = "cpp_cache_precompile_headers" in options or not hasattr(config, "cpp_cache_precompile_headers")
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = path
    try:
        with config.patch({} if kept else {"cpp_cache_precompile_headers": False}):
            yield
    # this variable alone: Inductor sets others inside the block, and C++ threads read the environment
    finally:
        if before is None:
            del os.environ["TORCHINDUCTOR_CACHE_DIR"]
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = before


@contextlib.contextmanager
def known_cpu_isa(record: str) -> Iterator[None]:
    """Inductor's probe of the CPU's vector ISAs (once a process per ISA: a build and a Python subprocess
    each, about 1 s) skipped (`cpp.vec_isa_ok`) where the JSON file `record` says the probe passed for
    every ISA this CPU's flags allow, with this torch build and C++ compiler; where the probe runs, its
    result is recorded (atomically). Nothing is done where the user set `cpp.vec_isa_ok`, off x86, or where
    Inductor lacks these names."""
    found = _isa_facts()
    if found is None:
        yield
        return
    isa, config, key, allowed = found
    known = read_json_dict(record)
    # on every entry: a later compile of this process checks the ISA again; `probed`: whether this process
    # has run the probe already
    skipped, probed = known.get(key) == allowed, isa.valid_vec_isa_list.cache_info().currsize
    with config.patch({"cpp.vec_isa_ok": True} if skipped else {}):
        yield
    # where the probe ran here: its result, for the next process
    if not (skipped or probed) and isa.valid_vec_isa_list.cache_info().currsize:
        with contextlib.suppress(OSError):
            valid = [str(i) for i in isa.valid_vec_isa_list()]
            atomic_write(record, json.dumps({**known, key: valid}).encode())


def _isa_facts() -> tuple[Any, Any, str, list[str]] | None:
    """(Inductor's ISA module, its config, this CPU's key, the ISAs its flags allow), or None where nothing
    is to be done (see `known_cpu_isa`)."""
    try:
        isa, config = _compat.cpu_vec_isa(), _compat.inductor_config()
        if config.cpp.vec_isa_ok is not None or platform.machine() not in ("x86_64", "AMD64"):
            return None
        flags = sorted(set(isa.x86_isa_checker()))
        allowed = [str(i) for i in isa.supported_vec_isa_list if all(f in flags for f in str(i).split())]
        build = [flags, torch.__version__, str(torch.version.git_version), _compat.cpp_compiler_version()]
        return isa, config, digest(json.dumps(build)), allowed
    except Exception:  # noqa: BLE001 - another torch: Inductor probes as it would
        return None
