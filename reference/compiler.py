"""Compile or load each distinct piece once: the bridge between the backend, the compilers and the cache.

`PieceCompiler.get` serves a (piece fingerprint, compile target) pair: from this process's memo when an identical
piece was already served, else from the on-disk cache, else by compiling (and storing). Across processes, a miss
is compiled under that entry's lock, so concurrent cold starts share the work: one compiles, the others wait and
load. `open_cache` opens the cache for a graph (or returns None: disabled, unusable, or a configuration that
cannot be keyed); `cache_factors` lists what enters the cache key.

Counters: `num_backend_compilations` counts every (piece, compile target) served, loads and shared pieces
included (vLLM's meaning: 13 for a 12-layer ToyLlama with one range, cold or warm); fresh compiles are
`num_inductor_compiles` / `num_eager_compiles`, loads `num_compiled_artifacts_loaded`, pieces served by an
identical piece `num_shared_piece_compiles`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

import torch.fx

from . import inductor
from ._compat import example_value
from .capturability import mutated_inputs
from .cache import CompileCache, cache_key
from .config import CompilationConfig
from .counters import counters
from .fingerprint import (
    UnkeyableConfigError,
    describe_value,
    digest,
    environment_factors,
    graph_fingerprint,
    inductor_config_factors,
)
from .split import SplitItem
from .values import tensors_in

__all__ = ["PieceCompiler", "Target", "cache_factors", "computes_tensors", "open_cache", "entry_name", "entry_claim"]

log = logging.getLogger("pieceworks")

Target = int | tuple[int, int]


def _target_name(target: Target) -> str:
    return f"size:{target}" if isinstance(target, int) else f"range:{target[0]}-{target[1]}"


def entry_name(fingerprint: str, target: Target) -> str:
    """The cache entry of a piece with `fingerprint` compiled for `target`."""
    return f"{_target_name(target)}|{fingerprint}"


def entry_claim(fingerprint: str, target: Target, example_args: Sequence[Any]) -> dict[str, str]:
    """What an entry must say about its piece to be loaded for it: fingerprint, target, input metadata."""
    return {
        "graph": fingerprint,
        "target": _target_name(target),
        "inputs": digest(*(describe_value(a) for a in example_args)),
    }


class PieceCompiler:
    """Compiles (or loads) each distinct (piece fingerprint, target) once."""

    def __init__(self, config: CompilationConfig, cache: CompileCache | None) -> None:
        self.config = config
        self.cache = cache
        self.done: dict[tuple[str, Target], Callable[..., Any]] = {}
        self.compiled = self.loaded = self.shared = 0

    def get(self, item: SplitItem, fingerprint: str, target: Target, example_args: Sequence[Any]) -> Callable:
        counters.num_backend_compilations += 1
        key = (fingerprint, target)
        if key in self.done:
            self.shared += 1
            counters.num_shared_piece_compiles += 1
            return self.done[key]
        as_traced = not computes_tensors(item.graph)
        if self.cache is None or as_traced:
            fn = self._compile(item, isinstance(target, int), example_args, as_traced)[0]
        else:
            chosen = "cpp_cache_precompile_headers" in self.config.inductor_compile_config
            with inductor.inductor_cache_dir(self.cache.inductor_dir, precompiled_headers=chosen):
                fn = self._get_cached(item, fingerprint, target, example_args)
        self.done[key] = fn
        return fn

    def _get_cached(self, item: SplitItem, fingerprint: str, target: Target, example_args: Sequence[Any]) -> Callable:
        cache = self.cache
        name = entry_name(fingerprint, target)
        claim = entry_claim(fingerprint, target, example_args)

        def load() -> Callable | None:
            fn = cache.load(name, lambda path: inductor.load_artifact(path, item.graph), claim)
            self.loaded += fn is not None
            return fn

        seen = cache.lookup(name)
        fn = load() if seen is not None else None
        if fn is not None:
            return fn
        with cache.entry_lock(name):
            # Another process may have stored it while we looked or waited; a corrupt entry we already rejected
            # is still the same entry, and is not tried (nor reported) twice.
            now = cache.lookup(name)
            if now is not None and now != seen:
                fn = load()
            if fn is None:
                fn, artifact = self._compile(item, isinstance(target, int), example_args)
                if artifact is not None:
                    cache.store(name, lambda path: inductor.save_artifact(artifact, path), claim)
        return fn

    def _compile(self, item: SplitItem, static: bool, example_args: Sequence[Any], as_traced: bool = False
                 ) -> tuple[Callable, Any]:
        """`as_traced`: the piece computes no tensor (`computes_tensors`), so it runs as traced whatever the
        compiler."""
        self.compiled += 1
        if self.config.compiler == "eager" or as_traced:
            counters.num_eager_compiles += 1
            return inductor.compile_eager(item.graph), None
        counters.num_inductor_compiles += 1
        return inductor.compile_inductor(
            item.graph, list(example_args), static=static, inductor_config=self.config.inductor_compile_config
        )


def computes_tensors(graph: torch.fx.GraphModule) -> bool:
    """Whether a piece returns a tensor or writes one of its inputs in place. One that does neither (size checks a
    split leaves alone in a piece, work whose results nothing reads) gives Inductor nothing to generate: its compile
    saves no artifact, so it would be compiled again on every warm start. Such a piece runs as traced (the eager
    compiler) and is never cached."""
    output = next(n for n in graph.graph.nodes if n.op == "output")
    return any(tensors_in(example_value(n)) for n in output.all_input_nodes) or bool(mutated_inputs(graph))


def cache_factors(gm: torch.fx.GraphModule, fakes: Sequence[Any], config: CompilationConfig) -> dict[str, str]:
    """Everything that changes compiled code, as digests: the graph with its input metadata, the config's
    code-relevant fields, the effective global Inductor/functorch configuration, and the software and GPU (see
    fingerprint.py). Nothing that varies per run. Raises `UnkeyableConfigError` when the Inductor configuration
    holds something that cannot be digested."""
    return {
        "environment": environment_factors(),
        "config": config.compute_hash(),
        "inductor": inductor_config_factors(),
        "graph": graph_fingerprint(gm, fakes),
    }


def open_cache(gm: torch.fx.GraphModule, fakes: Sequence[Any], config: CompilationConfig) -> CompileCache | None:
    """The compile cache for graph `gm`, or None: cache off (`config.cache_active()`), its directory unusable, or
    an Inductor configuration that cannot be keyed (each logged once with the reason)."""
    if not config.cache_active():
        return None
    try:
        factors = cache_factors(gm, fakes, config)
    except UnkeyableConfigError as exc:
        log.warning("pieceworks: compiling without the compile cache: %s", exc)
        return None
    cache = CompileCache.open(config.resolved_cache_dir(), cache_key(factors), factors)
    if cache is not None:
        log.info("pieceworks compile cache: %s%s", cache.directory, "" if cache.writable else " (read-only)")
    return cache
