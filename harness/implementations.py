"""Implementations under test: one small adapter per implementation, one registry.

An adapter turns (model, inputs maker, capture sizes, splitting ops) into a `Built`: a callable that serves any batch
size, plus what the harness can observe about it (capture order, pool bytes, capture seconds). `Capabilities` say
what the implementation claims, so a benchmark or property that needs a capability it lacks is reported as not
applicable, with the reason, instead of failing or being skipped silently.

Contract of `Built.__call__`: called like the model; outputs are valid until the next call (the CUDA-graph contract:
clone what you keep); inference only. Built objects own their graphs and pools; dropping the last reference frees
them (after `torch.cuda.synchronize()` and a gc). Not thread-safe.

Registry: `IMPLEMENTATIONS` maps a name to an `Implementation`; `resolve(spec)` takes a registered name or a
`package.module:Attribute` path naming an `Implementation` instance or subclass, so users can point the harness at
their own backend.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = ["Built", "Capabilities", "Implementation", "IMPLEMENTATIONS", "register", "resolve", "NotApplicable"]

InputsMaker = Callable[[int], tuple]


class NotApplicable(Exception):
    """Raised by a harness check when the implementation does not claim what the check needs (message: why)."""


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What an implementation claims. Checks needing a capability an implementation lacks are not applicable."""

    cuda_graphs: bool = False  # replays CUDA graphs for captured sizes
    padding: bool = False  # a batch between captured sizes replays the next captured size's graph
    piecewise: bool = False  # splitting ops run eagerly between graphs
    shared_pool: bool = False  # every captured size lives in one memory pool
    compile_cache: bool = False  # an on-disk compile cache (warm starts)
    needs_cuda: bool = False  # cannot run at all without a CUDA device


@dataclasses.dataclass
class Built:
    """A built implementation: `fn(*args)` serves a batch. The optional fields are what the harness may observe.

    `capture_order`: batch sizes in the order their graphs were captured (None: not observable).
    `pool`: the graph memory pool handle (`torch.cuda.graph_pool_handle()`), for per-pool allocator bytes.
    `capture_seconds`: wall time of the capture phase. `owner`: whatever must stay alive while `fn` is used.
    """

    fn: Callable[..., Any]
    capture_order: list[int] | None = None
    pool: Any = None
    capture_seconds: float | None = None
    owner: Any = None

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


class Implementation:
    """Base adapter. Subclasses set `name`, `capabilities` and implement `build`."""

    name: str = "?"
    capabilities: Capabilities = Capabilities()

    def unavailable_reason(self) -> str | None:
        """None when this implementation can run here; else why not (missing package, no CUDA)."""
        if self.capabilities.needs_cuda and not torch.cuda.is_available():
            return f"{self.name} needs CUDA: torch {torch.__version__} sees no CUDA device"
        return None

    def build(
        self, model: torch.nn.Module, make_inputs: InputsMaker, capture_sizes: Sequence[int],
        splitting_ops: Sequence[str],
    ) -> Built:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<implementation {self.name}>"


class Eager(Implementation):
    name = "eager"

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        return Built(model)


class Pieceworks(Implementation):
    """pieceworks in one CUDA-graph mode, compiled with `compiler` ("inductor" or "eager"), cache in `cache_dir`."""

    def __init__(self, mode: str, compiler: str = "inductor", cache_dir: str | None = None, **config: Any) -> None:
        self.mode = mode
        self.compiler = compiler
        self.cache_dir = cache_dir
        self.config = config
        graphs = mode != "NONE"
        self.name = f"pieceworks-{mode.lower()}" + ("" if compiler == "inductor" else f"-{compiler}")
        self.capabilities = Capabilities(
            cuda_graphs=graphs, padding=graphs, piecewise=mode in ("PIECEWISE", "FULL_AND_PIECEWISE"),
            shared_pool=graphs, compile_cache=compiler == "inductor", needs_cuda=False,
        )

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        import time

        import pieceworks

        config = pieceworks.CompilationConfig(
            splitting_ops=list(splitting_ops), cudagraph_mode=self.mode, compiler=self.compiler,
            cudagraph_capture_sizes=list(capture_sizes), cache_dir=self.cache_dir, **self.config,
        )
        compiled = pieceworks.compile(model, config)
        compiled(*make_inputs(min(3, max(capture_sizes))))  # trace and compile
        start = time.perf_counter()
        compiled.capture()
        seconds = time.perf_counter() - start
        runtime = compiled.runtime
        return Built(compiled, capture_order=list(runtime.capture_order) or None, pool=runtime.pool.handle,
                     capture_seconds=seconds, owner=compiled)


IMPLEMENTATIONS: dict[str, Implementation] = {}


def register(impl: Implementation) -> Implementation:
    """Add `impl` to the registry under `impl.name` (a later registration of the same name replaces it)."""
    IMPLEMENTATIONS[impl.name] = impl
    return impl


for _impl in [Eager(), *(Pieceworks(m) for m in ("NONE", "PIECEWISE", "FULL", "FULL_AND_PIECEWISE"))]:
    register(_impl)


def resolve(spec: str) -> Implementation:
    """A registered name, or `package.module:Attribute` naming an `Implementation` instance or subclass."""
    if spec in IMPLEMENTATIONS:
        return IMPLEMENTATIONS[spec]
    if ":" not in spec:
        raise KeyError(
            f"unknown implementation {spec!r}; registered: {sorted(IMPLEMENTATIONS)}. Fix: pass one of those, or "
            f"'package.module:Adapter' for your own (a pieceworks.harness.implementations.Implementation)"
        )
    module_name, _, attr = spec.partition(":")
    target = getattr(importlib.import_module(module_name), attr)
    impl = target() if isinstance(target, type) else target
    if not isinstance(impl, Implementation):
        raise TypeError(f"{spec} is a {type(impl).__name__}, not a pieceworks.harness.implementations.Implementation")
    return impl
