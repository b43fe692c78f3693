"""Compile or load each distinct piece once: the bridge between the backend, the compilers and the cache.

`PieceCompiler.get` serves a (piece fingerprint, compile target) pair: from this process's memo when an identical
piece was already served, else from the on-disk cache, else by compiling (and storing). `cache_factors` lists what
enters the cache key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch.fx

from . import inductor
from .cache import CompileCache
from .config import CompilationConfig
from .counters import counters
from .fingerprint import environment_factors, graph_fingerprint
from .split import SplitItem

__all__ = ["PieceCompiler", "Target", "cache_factors"]

Target = int | tuple[int, int]


class PieceCompiler:
    """Compiles (or loads) each distinct (piece fingerprint, target) once."""

    def __init__(self, config: CompilationConfig, cache: CompileCache | None) -> None:
        self.config = config
        self.cache = cache
        self.done: dict[tuple[str, Target], Callable[..., Any]] = {}
        self.compiled = self.loaded = self.shared = 0

    def get(self, item: SplitItem, fingerprint: str, target: Target, example_args: Sequence[Any]) -> Callable:
        key = (fingerprint, target)
        if key in self.done:
            self.shared += 1
            counters.num_shared_piece_compiles += 1
            return self.done[key]
        static = isinstance(target, int)
        name = (f"size:{target}" if static else f"range:{target[0]}-{target[1]}") + f"|{fingerprint}"
        fn = None
        if self.cache is not None:
            fn = self.cache.load(name, lambda path: inductor.load_artifact(path, item.graph))
            self.loaded += fn is not None
        if fn is None:
            fn = self._compile(item, name, static, example_args)
        self.done[key] = fn
        return fn

    def _compile(self, item: SplitItem, name: str, static: bool, example_args: Sequence[Any]) -> Callable:
        self.compiled += 1
        counters.num_backend_compilations += 1
        if self.config.compiler == "eager":
            counters.num_eager_compiles += 1
            return inductor.compile_eager(item.graph)
        counters.num_inductor_compiles += 1
        fn, artifact = inductor.compile_inductor(
            item.graph, list(example_args), static=static, inductor_config=self.config.inductor_compile_config
        )
        if self.cache is not None:
            self.cache.store(name, lambda path: inductor.save_artifact(artifact, path))
        return fn


def cache_factors(gm: torch.fx.GraphModule, fakes: Sequence[Any], config: CompilationConfig) -> dict[str, str]:
    """Everything that changes compiled code, as digests: the graph with its input metadata, the config's
    code-relevant fields, and the software and GPU (see fingerprint.py). Nothing that varies per run."""
    return {
        "environment": environment_factors(),
        "config": config.compute_hash(),
        "graph": graph_fingerprint(gm, fakes),
    }
