"""Implementations under test: one small adapter per implementation, one registry.

An adapter turns (model, inputs maker, capture sizes, splitting ops) into a `Built`: a callable that serves any batch
size, plus what the harness can observe about it (capture order, pool bytes, capture seconds). `Capabilities` say
what the implementation claims, so a benchmark or property that needs a capability it lacks is reported as not
applicable, with the reason, instead of failing or being skipped silently.

Contract of `Built.__call__`: called like the model; outputs are valid until the next call (the CUDA-graph contract:
clone what you keep); inference only: call it under `torch.no_grad()`. Built objects own their graphs and pools;
dropping the last reference frees them (after `torch.cuda.synchronize()` and a gc). Not thread-safe. Build one
implementation of a model at a time: torch.compile-based adapters reset Dynamo when they build.

Built in: `eager`; `inductor` (`torch.compile` defaults, no graphs); `reduce-overhead` (Inductor + CUDA-graph trees,
one recording per size, no padding); `pieceworks-none|piecewise|full|full_and_piecewise`; `meta-pcg` (Meta's
`piecewise-cuda-graphs`, the optional extra `pcg`: unavailable, with the reason, where it is not installed).

Registry: `IMPLEMENTATIONS` maps a name to an `Implementation`; `resolve(spec)` takes a registered name or a
`package.module:Attribute` path naming an `Implementation` instance or subclass, so users can point the harness at
their own backend; `load_user_implementations()` registers the paths listed in $PIECEWORKS_IMPLEMENTATIONS
(comma-separated), which is how the benchmarks pick them up.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import importlib
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch

__all__ = [
    "Built", "Capabilities", "Implementation", "IMPLEMENTATIONS", "register", "resolve", "load_user_implementations",
    "NotApplicable",
]

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
    `capture_report`: the implementation's own account of its capture (pieceworks: `CompiledModel.capture()`).
    """

    fn: Callable[..., Any]
    capture_order: list[int] | None = None
    pool: Any = None
    capture_seconds: float | None = None
    owner: Any = None
    capture_report: dict[str, Any] | None = None  # what the implementation itself reported about its capture

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
        report = compiled.capture()
        seconds = time.perf_counter() - start
        runtime = compiled.runtime
        return Built(compiled, capture_order=list(runtime.capture_order) or None, pool=runtime.pool.handle,
                     capture_seconds=seconds, owner=compiled, capture_report=report)


def _batch_of(args: Sequence[Any]) -> int:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.shape[0]
    raise ValueError("no tensor argument: the harness reads the batch size from dim 0 of a tensor argument")


def _cut(value: Any, batch: int, n: int) -> Any:
    """`value` with every tensor whose dim 0 is the padded size `n` cut back to `batch` rows (tuples, lists too)."""
    if isinstance(value, torch.Tensor):
        return value[:batch] if value.dim() > 0 and value.shape[0] == n else value
    if isinstance(value, (tuple, list)):
        return type(value)(_cut(v, batch, n) for v in value)
    return value


def _raise_recompile_limit(n: int) -> None:
    """dynamic=False compiles once per batch size: let Dynamo keep `n` of them (its default limit is 8)."""
    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    if getattr(config, name) < n:
        setattr(config, name, n)


class Inductor(Implementation):
    """`torch.compile(model)` with its defaults: Inductor, no CUDA graphs, Dynamo's automatic dynamic shapes.

    `build` resets Dynamo (an earlier build of the same model with another backend must not serve this one) and
    calls every given size once, so that compiles happen before anyone times the result.
    """

    name = "inductor"
    capabilities = Capabilities()

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        torch._dynamo.reset()
        compiled = torch.compile(model)
        with torch.no_grad():
            for n in sorted(set(capture_sizes)):
                compiled(*make_inputs(n))
        return Built(compiled, owner=compiled)


class ReduceOverhead(Implementation):
    """`torch.compile(model, mode="reduce-overhead", dynamic=False)`: Inductor plus CUDA-graph trees.

    One compile and one recording per batch size, no padding: `build` records every given size (largest first,
    three calls each: trees warm up before they record); a size not given compiles and records when first called.
    The trees' pool is private to torch, so `Built.pool` is None.
    """

    name = "reduce-overhead"
    capabilities = Capabilities(cuda_graphs=True, shared_pool=True, needs_cuda=True)

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        torch._dynamo.reset()
        sizes = sorted(set(capture_sizes), reverse=True)
        _raise_recompile_limit(len(sizes) + 2)
        compiled = torch.compile(model, mode="reduce-overhead", dynamic=False)
        with torch.no_grad():
            for n in sizes:
                inputs = make_inputs(n)
                for _ in range(3):
                    compiled(*inputs)
        torch.cuda.synchronize()
        return Built(compiled, owner=compiled)


class _NoGraphBreaks(torch.overrides.TorchFunctionMode):
    """While active, every call of a splitting op goes through `no_graph` (Meta pcg's eager break)."""

    def __init__(self, splitting_ops: Sequence[str], no_graph: Callable[..., Any]) -> None:
        super().__init__()
        from pieceworks.split import op_names

        self.op_names = op_names
        self.splitting_ops = set(splitting_ops)
        self.no_graph = no_graph
        self.breaks = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.op_names(func) & self.splitting_ops:
            self.breaks += 1
            return self.no_graph(func)(*args, **kwargs)
        return func(*args, **kwargs)


class MetaPCG(Implementation):
    """Meta's `piecewise-cuda-graphs` (PyPI, pure Python): the eager model captured, per batch size, as a sequence of
    CUDA graphs with the splitting ops run eagerly between them (its `no_graph`), all sizes in one pool, largest
    first, on one side stream after a warm-up there. No compiler, no cache.

    Serving mirrors pieceworks: a batch of b rows is copied into static buffers (one max-size buffer per tensor
    argument; padded rows hold valid rows of earlier calls), the sequence of the smallest captured size >= b
    replays, and its outputs are cut back to b rows; above the largest size the eager model runs. The splitting
    ops must write into buffers they are given and return no CUDA tensor (pcg's rule); non-tensor arguments must
    equal the example's.
    """

    name = "meta-pcg"
    capabilities = Capabilities(cuda_graphs=True, padding=True, piecewise=True, shared_pool=True, needs_cuda=True)

    def unavailable_reason(self) -> str | None:
        try:
            import piecewise_cuda_graphs  # noqa: F401
        except ImportError:
            return ("meta-pcg needs Meta's piecewise-cuda-graphs (PyPI, pure Python), which is not installed. Fix: "
                    "pip install 'pieceworks[pcg]' (or pip install piecewise-cuda-graphs)")
        return super().unavailable_reason()

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        import time

        import piecewise_cuda_graphs as pcg

        sizes = sorted(set(capture_sizes), reverse=True)
        static = [a.clone() if isinstance(a, torch.Tensor) else a for a in make_inputs(sizes[0])]

        def views(n: int) -> list[Any]:
            return [a[:n] if isinstance(a, torch.Tensor) else a for a in static]

        stream = torch.cuda.Stream()
        pool = torch.cuda.graph_pool_handle()
        # The warm-up makes the capture stream's cuBLAS workspace, which every captured GEMM keeps using. In a
        # MemPool of its own it stays mapped when other code (reduce-overhead's graph trees) clears cuBLAS
        # workspaces and empties the cache; in the default pool it would be freed under the graphs (pieceworks
        # warms up the same way).
        warmup_pool = torch.cuda.MemPool() if hasattr(torch.cuda, "MemPool") else None
        captured: dict[int, tuple[Any, Any]] = {}
        start = time.perf_counter()
        with torch.no_grad():
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):  # library workspaces are made on the stream that captures
                with torch.cuda.use_mem_pool(warmup_pool) if warmup_pool is not None else contextlib.nullcontext():
                    for n in sizes:
                        model(*views(n))
            torch.cuda.current_stream().wait_stream(stream)
            for n in sizes:
                seq = pcg.CUDAGraphSequence(pool=pool)
                breaks = _NoGraphBreaks(splitting_ops, pcg.no_graph)
                with pcg.piecewise_graph(seq, stream=stream), breaks:
                    out = model(*views(n))
                if not breaks.breaks and splitting_ops:
                    raise RuntimeError(f"meta-pcg: no call of {list(splitting_ops)} seen while capturing batch {n}")
                captured[n] = (seq, out)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        ordered = sorted(captured)

        def serve(*args: Any) -> Any:
            batch = _batch_of(args)
            i = bisect.bisect_left(ordered, batch)
            if i == len(ordered):
                return model(*args)
            n = ordered[i]
            for buffer, a in zip(static, args):
                if isinstance(a, torch.Tensor):
                    buffer[:batch].copy_(a)
            seq, out = captured[n]
            seq.replay()
            return _cut(out, batch, n)

        return Built(serve, capture_order=sizes, pool=pool, capture_seconds=seconds, owner=(captured, warmup_pool))


IMPLEMENTATIONS: dict[str, Implementation] = {}


def register(impl: Implementation) -> Implementation:
    """Add `impl` to the registry under `impl.name` (a later registration of the same name replaces it)."""
    IMPLEMENTATIONS[impl.name] = impl
    return impl


for _impl in [
    Eager(), Inductor(), ReduceOverhead(), *(Pieceworks(m) for m in ("NONE", "PIECEWISE", "FULL", "FULL_AND_PIECEWISE")),
    MetaPCG(),
]:
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
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(
            f"implementation {spec!r}: cannot import module {module_name!r} ({exc}). Fix: make it importable "
            f"(installed, or its folder on PYTHONPATH) and write 'package.module:Adapter'"
        ) from exc
    try:
        target = getattr(module, attr)
    except AttributeError:
        raise AttributeError(
            f"implementation {spec!r}: module {module_name!r} has no attribute {attr!r}. Fix: name an Implementation "
            f"instance or subclass defined there"
        ) from None
    impl = target() if isinstance(target, type) else target
    if not isinstance(impl, Implementation):
        raise TypeError(f"{spec} is a {type(impl).__name__}, not a pieceworks.harness.implementations.Implementation")
    return impl


USER_IMPLEMENTATIONS_ENV = "PIECEWORKS_IMPLEMENTATIONS"


def load_user_implementations(specs: str | None = None) -> list[Implementation]:
    """Resolve and register users' implementations: comma-separated `package.module:Attribute` paths in `specs`
    (default: the environment variable PIECEWORKS_IMPLEMENTATIONS). Returns them, in order. Each registers under its
    own `name` (replacing a built-in of the same name); a path that does not resolve raises, naming it.
    """
    if specs is None:
        specs = os.environ.get(USER_IMPLEMENTATIONS_ENV, "")
    found = []
    for spec in (s.strip() for s in specs.split(",")):
        if not spec:
            continue
        if ":" not in spec:
            raise ValueError(
                f"{USER_IMPLEMENTATIONS_ENV} entry {spec!r} is not a 'package.module:Adapter' path. Fix: write the "
                f"module and the Implementation's name separated by ':'"
            )
        found.append(register(resolve(spec)))
    return found
