"""pieceworks itself, one adapter per CUDA-graph mode."""

from __future__ import annotations

import time
from typing import Any

import pieceworks

from .base import Built, Capabilities, Implementation


class Pieceworks(Implementation):
    """pieceworks in one CUDA-graph mode, compiled with `compiler` ("inductor" or "eager"), cache in
    `cache_dir`; `config` adds `CompilationConfig` fields."""

    def __init__(
        self, mode: str, compiler: str = "inductor", cache_dir: str | None = None, **config: Any
    ) -> None:
        self.mode, self.compiler, self.cache_dir, self.config = mode, compiler, cache_dir, config
        graphs = mode != "NONE"
        self.name = f"pieceworks-{mode.lower()}" + ("" if compiler == "inductor" else f"-{compiler}")
        self.capabilities = Capabilities(
            cuda_graphs=graphs,
            padding=graphs,
            shared_pool=graphs,
            piecewise=mode in ("PIECEWISE", "FULL_AND_PIECEWISE"),
            compile_cache=compiler == "inductor",
        )
        self.contracts = (
            {}
            if graphs
            else {
                "cuda_graphs": "cudagraph_mode NONE: compiled pieces, no CUDA graphs",
                "padding": "cudagraph_mode NONE: no graphs, nothing padded",
                "shared_pool": "cudagraph_mode NONE: no graphs, no graph pool",
            }
        )
        if compiler != "inductor":
            self.contracts["compile_cache"] = (
                f"compiler {compiler!r}: nothing compiled with Inductor, nothing cached"
            )

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        config = pieceworks.CompilationConfig(
            splitting_ops=list(splitting_ops),
            cudagraph_mode=self.mode,
            compiler=self.compiler,
            cudagraph_capture_sizes=list(capture_sizes),
            cache_dir=self.cache_dir,
            **self.config,
        )
        compiled = pieceworks.compile(model, config)

        counters = pieceworks.counters
        before = counters.num_inductor_compiles + counters.num_eager_compiles
        compiled(*make_inputs(min(3, max(capture_sizes))))  # trace and compile
        compiled_now = counters.num_inductor_compiles + counters.num_eager_compiles - before
        start = time.perf_counter()
        report = compiled.capture()
        seconds = time.perf_counter() - start
        runtime = compiled.runtime
        return Built(
            compiled,
            capture_order=list(runtime.captured_sizes) or None,
            pool=runtime.pool.handle,
            capture_seconds=seconds,
            owner=compiled,
            capture_report=report,
            compiles=compiled_now,
        )
