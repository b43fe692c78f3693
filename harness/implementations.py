"""Implementations under test: one small adapter per implementation, one registry.

An adapter turns (model, inputs maker, capture sizes, splitting ops) into a `Built`: a callable that serves any batch
size, plus what the harness can observe about it (capture order, pool bytes, capture seconds). `Capabilities` say
what the implementation claims, so a benchmark or property that needs a capability it lacks is reported as not
applicable, with the reason, instead of failing or being skipped silently.

Contract of `Built.__call__`: called like the model; outputs are valid until the next call (the CUDA-graph contract:
clone what you keep); inference only: call it under `torch.no_grad()`. Built objects own their graphs and pools;
dropping the last reference frees them (after `torch.cuda.synchronize()` and a gc). Not thread-safe. Build one
implementation of a model at a time: torch.compile-based adapters reset Dynamo when they build. Builds that never
enter Dynamo after they are made (eager, pieceworks, meta-pcg) may stay alive next to one torch.compile-based build
made after them (the latency benchmark and `runtime_breakdown` time them side by side that way).

Built in: `eager`; `inductor` (`torch.compile` defaults, no graphs); `reduce-overhead` (Inductor + CUDA-graph trees,
one recording per size, no padding); `dynamo-cudagraphs` (`torch.compile(backend="cudagraphs")`: AOT eager + CUDA-graph
trees, one recording per size); `make-graphed-callables` (`torch.cuda.make_graphed_callables`, one graphed callable
per captured size, no padding); `pieceworks-none|piecewise|full|full_and_piecewise`; `meta-pcg` (Meta's
`piecewise-cuda-graphs`, the optional extra `pcg`); `vllm` (vLLM's compilation backend, where `vllm` is importable).
An adapter whose package is missing is unavailable, with the reason.

`Implementation.contracts` maps a capability the implementation does not claim to why (its contract, not a bug), so a
property that needs it is reported as not applicable with that reason; the keys "pool" and "compiles" say why
`Built.pool` / `Built.capture_order` or `Built.compiles` are not observable.

Registry: `IMPLEMENTATIONS` maps a name to an `Implementation`; `resolve(spec)` takes a registered name, a
`package.module:Attribute` path or a `path/to/file.py:Attribute` path naming an `Implementation` instance or subclass,
so users can point the harness at their own backend; `load_user_implementations()` registers the paths listed in $PIECEWORKS_IMPLEMENTATIONS
(comma-separated), which is how the benchmarks pick them up.
"""

from __future__ import annotations

import bisect
import contextlib
import dataclasses
import hashlib
import importlib
import importlib.util
import os
import sys
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
    `compiles`: how many pieces the build compiled afresh (a warm start from a compile cache: 0); None: not observable.
    """

    fn: Callable[..., Any]
    capture_order: list[int] | None = None
    pool: Any = None
    capture_seconds: float | None = None
    owner: Any = None
    capture_report: dict[str, Any] | None = None  # what the implementation itself reported about its capture
    compiles: int | None = None

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


class Implementation:
    """Base adapter. Subclasses set `name`, `capabilities` and implement `build`."""

    name: str = "?"
    capabilities: Capabilities = Capabilities()
    contracts: dict[str, str] = {}  # capability not claimed -> why (the implementation's contract)

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
    contracts = {"cuda_graphs": "runs the model eagerly: no CUDA graphs (the reference the others are compared with)"}

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
        self.contracts = {}
        if not graphs:
            self.contracts.update(cuda_graphs="cudagraph_mode NONE: compiled pieces, no CUDA graphs",
                                  padding="cudagraph_mode NONE: no graphs, nothing padded",
                                  shared_pool="cudagraph_mode NONE: no graphs, no graph pool")
        if compiler != "inductor":
            self.contracts["compile_cache"] = f"compiler {compiler!r}: nothing compiled with Inductor, nothing cached"

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        import time

        import pieceworks

        config = pieceworks.CompilationConfig(
            splitting_ops=list(splitting_ops), cudagraph_mode=self.mode, compiler=self.compiler,
            cudagraph_capture_sizes=list(capture_sizes), cache_dir=self.cache_dir, **self.config,
        )
        compiled = pieceworks.compile(model, config)
        before = pieceworks.counters.num_inductor_compiles + pieceworks.counters.num_eager_compiles
        compiled(*make_inputs(min(3, max(capture_sizes))))  # trace and compile
        compiles = pieceworks.counters.num_inductor_compiles + pieceworks.counters.num_eager_compiles - before
        start = time.perf_counter()
        report = compiled.capture()
        seconds = time.perf_counter() - start
        runtime = compiled.runtime
        return Built(compiled, capture_order=list(runtime.captured_sizes) or None, pool=runtime.pool.handle,
                     capture_seconds=seconds, owner=compiled, capture_report=report, compiles=compiles)


def _batch_of(args: Sequence[Any]) -> int:
    for a in args:
        if isinstance(a, torch.Tensor):
            return a.shape[0]
    raise ValueError("no tensor argument: the harness reads the batch size from dim 0 of a tensor argument")


def _cut(value: Any, batch: int, n: int) -> Any:
    """`value` with every tensor whose dim 0 is the padded size `n` cut back to `batch` rows (tuples, lists and dicts
    too)."""
    if isinstance(value, torch.Tensor):
        return value[:batch] if value.dim() > 0 and value.shape[0] == n else value
    if isinstance(value, (tuple, list)):
        return type(value)(_cut(v, batch, n) for v in value)
    if isinstance(value, dict):
        return type(value)((k, _cut(v, batch, n)) for k, v in value.items())
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
    contracts = {"cuda_graphs": "torch.compile's defaults: Inductor kernels, no CUDA graphs"}

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        torch._dynamo.reset()
        compiled = torch.compile(model)
        with torch.no_grad():
            for n in sorted(set(capture_sizes)):
                compiled(*make_inputs(n))
        return Built(compiled, owner=compiled)


def _record_per_size(compiled: Callable[..., Any], make_inputs: InputsMaker, sizes: list[int]) -> None:
    """Call `compiled` three times at each size, largest first: CUDA-graph trees warm up, then record, per size."""
    with torch.no_grad():
        for n in sizes:
            inputs = make_inputs(n)
            for _ in range(3):
                compiled(*inputs)
    torch.cuda.synchronize()


_PER_SIZE = "records one CUDA graph per batch size (a new size compiles and records when first called) instead of padding"
_TREES_POOL = "CUDA-graph trees keep their pool private to torch: Built.pool is None, pool bytes are not observable"


class _PerSizeRecording(Implementation):
    """`torch.compile(model, dynamic=False, **options)` with CUDA-graph trees: one trace, compile and recording per
    batch size, no padding. `build` records every given size (largest first, three calls each: trees warm up before
    they record); a size not given compiles and records when first called. The trees' pool is private to torch, so
    `Built.pool` is None."""

    capabilities = Capabilities(cuda_graphs=True, shared_pool=True, needs_cuda=True)
    contracts = {"padding": _PER_SIZE, "pool": _TREES_POOL}
    options: dict[str, Any] = {}

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        torch._dynamo.reset()
        sizes = sorted(set(capture_sizes), reverse=True)
        _raise_recompile_limit(len(sizes) + 8)
        compiled = torch.compile(model, dynamic=False, **self.options)
        _record_per_size(compiled, make_inputs, sizes)
        return Built(compiled, owner=compiled)


class ReduceOverhead(_PerSizeRecording):
    """`torch.compile(model, mode="reduce-overhead", dynamic=False)`: Inductor plus CUDA-graph trees."""

    name = "reduce-overhead"
    options = {"mode": "reduce-overhead"}


class DynamoCudagraphs(_PerSizeRecording):
    """`torch.compile(model, backend="cudagraphs", dynamic=False)`: Dynamo's CUDA-graph backend (AOT eager, no
    Inductor, CUDA-graph trees)."""

    name = "dynamo-cudagraphs"
    options = {"backend": "cudagraphs"}


class GraphedCallables(Implementation):
    """`torch.cuda.make_graphed_callables`: one graphed callable per captured size (each warmed up and captured by
    torch, in a pool of its own), largest first; any other size runs the eager model. No padding, no compiler.

    The model is passed as a plain function, so torch neither replaces its `forward` nor treats its parameters as
    inputs (inference only). Every argument must be a tensor (make_graphed_callables' rule).
    """

    name = "make-graphed-callables"
    capabilities = Capabilities(cuda_graphs=True, needs_cuda=True)
    contracts = {
        "padding": "one graphed callable per captured size; other sizes run eagerly: no padding",
        "shared_pool": "each graphed callable captures into a pool of its own",
    }

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        import time

        sizes = sorted(set(capture_sizes), reverse=True)
        graphed: dict[int, Callable[..., Any]] = {}
        start = time.perf_counter()
        with torch.no_grad():
            for n in sizes:
                graphed[n] = torch.cuda.make_graphed_callables(lambda *args: model(*args), tuple(make_inputs(n)))
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start

        def serve(*args: Any) -> Any:
            fn = graphed.get(_batch_of(args))
            return fn(*args) if fn is not None else model(*args)

        return Built(serve, capture_order=sizes, capture_seconds=seconds, owner=graphed)


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


def _vllm_model(model: torch.nn.Module, arity: int, support_torch_compile: Callable[..., Any], vllm_config: Any):
    """`model` behind a module vLLM's `@support_torch_compile` can compile: forward takes `arity` tensors named
    a0..a{arity-1}, each with its dim 0 (the token count) dynamic."""
    names = [f"a{i}" for i in range(arity)]

    class _Wrapped(torch.nn.Module):
        def __init__(self, *, vllm_config: Any, prefix: str = "", inner: torch.nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, a0, a1=None, a2=None, a3=None):
            return self.inner(*(a0, a1, a2, a3)[:arity])

    if arity > 4:
        raise ValueError(f"the vllm adapter takes models of at most 4 tensor arguments, not {arity}")
    wrapped = support_torch_compile(dynamic_arg_dims={name: 0 for name in names})(_Wrapped)
    return wrapped(vllm_config=vllm_config, prefix="", inner=model)


class VLLM(Implementation):
    """vLLM's compilation backend (`vllm.compilation`), driven as vLLM's own piecewise tests and model runner drive
    it: the model behind `@support_torch_compile` under a `VllmConfig` with `CompilationMode.VLLM_COMPILE`,
    `CUDAGraphMode.PIECEWISE`, the splitting ops and capture sizes given; each call under `set_forward_context` with
    the runtime mode and a `BatchDescriptor(num_tokens=n)`.

    Serving does what vLLM's model runner does: a batch of b rows is copied into persistent buffers (one max-size
    buffer per argument), padded to the smallest capture size n >= b, run under PIECEWISE with num_tokens=n and cut
    back to b rows; above the largest size it runs under runtime mode NONE (compiled, no graphs). `build` compiles
    with one run under NONE, then captures each size largest first (vLLM's wrapper captures a size on first sight).
    Written against vLLM's API as of its 0.11 line (`CompilationMode`, `set_forward_context(..., batch_descriptor)`).
    """

    name = "vllm"
    capabilities = Capabilities(cuda_graphs=True, padding=True, piecewise=True, shared_pool=True, needs_cuda=True)
    contracts = {
        "pool": "vLLM captures into one graph pool global to the process (current_platform.get_global_graph_pool()):"
                " not observable per model",
        "compile_cache": "vLLM keeps its own compile cache (~/.cache/vllm/torch_compile_cache); this adapter does not"
                         " observe its compiles",
    }

    def unavailable_reason(self) -> str | None:
        try:
            import vllm  # noqa: F401
        except ImportError as exc:
            return (f"vllm is not importable here ({exc}). vLLM pins a torch build of its own and is installed from "
                    "the network, so it cannot be installed on a machine without network access. Fix: pip "
                    "install vllm in an environment whose torch is the one vLLM pins, and run there")
        return super().unavailable_reason()

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        import time

        from vllm.compilation.decorators import support_torch_compile
        from vllm.config import CompilationConfig, CompilationMode, CUDAGraphMode, VllmConfig, set_current_vllm_config
        from vllm.forward_context import BatchDescriptor, set_forward_context

        sizes = sorted(set(capture_sizes))
        static = [a.clone() for a in make_inputs(sizes[-1])]
        vllm_config = VllmConfig(compilation_config=CompilationConfig(
            mode=CompilationMode.VLLM_COMPILE, cudagraph_mode=CUDAGraphMode.PIECEWISE,
            splitting_ops=list(splitting_ops), cudagraph_capture_sizes=sizes,
        ))
        with set_current_vllm_config(vllm_config):
            compiled = _vllm_model(model, len(static), support_torch_compile, vllm_config)

        def run(args: Sequence[Any], n: int | None) -> Any:
            mode = CUDAGraphMode.NONE if n is None else CUDAGraphMode.PIECEWISE
            descriptor = None if n is None else BatchDescriptor(num_tokens=n)
            with set_current_vllm_config(vllm_config), set_forward_context(
                    None, vllm_config, cudagraph_runtime_mode=mode, batch_descriptor=descriptor):
                return compiled(*args)

        def serve(*args: Any) -> Any:
            batch = _batch_of(args)
            i = bisect.bisect_left(sizes, batch)
            if i == len(sizes):
                return run(args, None)
            n = sizes[i]
            for buffer, a in zip(static, args):
                buffer[:batch].copy_(a)
            return _cut(run([s[:n] for s in static], n), batch, n)

        start = time.perf_counter()
        with torch.no_grad():
            run(static, None)  # trace and compile
            for n in reversed(sizes):
                run([s[:n] for s in static], n)
        if static[0].is_cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        return Built(serve, capture_order=list(reversed(sizes)), capture_seconds=seconds, owner=(compiled, static))


IMPLEMENTATIONS: dict[str, Implementation] = {}


def register(impl: Implementation) -> Implementation:
    """Add `impl` to the registry under `impl.name` (a later registration of the same name replaces it)."""
    IMPLEMENTATIONS[impl.name] = impl
    return impl


for _impl in [
    Eager(), Inductor(), ReduceOverhead(), DynamoCudagraphs(), GraphedCallables(),
    *(Pieceworks(m) for m in ("NONE", "PIECEWISE", "FULL", "FULL_AND_PIECEWISE")), MetaPCG(), VLLM(),
]:
    register(_impl)


def _import_module(spec: str, module_name: str) -> Any:
    """A module by dotted name, or by file path (`path/to/file.py`: loaded under its stem, once per path)."""
    if module_name.endswith(".py") or os.sep in module_name:
        path = os.path.abspath(module_name)
        if not os.path.isfile(path):
            raise ImportError(f"implementation {spec!r}: no file {path}. Fix: name an existing .py file, or write "
                              f"'package.module:Adapter'")
        name = f"pieceworks_user_{os.path.basename(path)[:-3]}_{hashlib.sha1(path.encode()).hexdigest()[:8]}"
        if name not in sys.modules:
            file_spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(file_spec)
            sys.modules[name] = module
            try:
                file_spec.loader.exec_module(module)
            except BaseException:
                del sys.modules[name]
                raise
        return sys.modules[name]
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(
            f"implementation {spec!r}: cannot import module {module_name!r} ({exc}). Fix: make it importable "
            f"(installed, or its folder on PYTHONPATH) and write 'package.module:Adapter', or give its file: "
            f"'path/to/file.py:Adapter'"
        ) from exc


def resolve(spec: str) -> Implementation:
    """A registered name, or `package.module:Attribute` or `path/to/file.py:Attribute` naming an `Implementation`
    instance or subclass."""
    if spec in IMPLEMENTATIONS:
        return IMPLEMENTATIONS[spec]
    if ":" not in spec:
        raise KeyError(
            f"unknown implementation {spec!r}; registered: {sorted(IMPLEMENTATIONS)}. Fix: pass one of those, or "
            f"'package.module:Adapter' for your own (a pieceworks.harness.implementations.Implementation)"
        )
    module_name, _, attr = spec.rpartition(":")
    module = _import_module(spec, module_name)
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
