"""Implementations under test: one small adapter per implementation, one registry (docs/conformance.md).

An adapter's `build(model, make_inputs, capture_sizes, splitting_ops)` returns a `Built`: a callable that serves any
batch size, plus what the harness can observe; `make_inputs(batch)` gives the model's arguments for `batch` rows.
`Capabilities` say what it claims; `contracts` map a capability not claimed (or "pool", "compiles": a `Built` field
not observable; "argument_writes": the model's in-place writes to its arguments do not reach the caller's) to why,
so a check needing it is reported as not applicable with that reason. An adapter whose package is missing is unavailable (`unavailable_reason()`).

Contract of `Built.__call__`: called like the model; outputs are valid until the next call (clone what you keep);
inference only (under `torch.no_grad()`); not thread-safe. A `Built` owns its graphs and pools: dropping the last
reference frees them (after `torch.cuda.synchronize()` and a gc). Build one implementation of a model at a time:
torch.compile-based adapters reset Dynamo when they build; builds that never enter Dynamo again (eager, pieceworks,
meta-pcg) may stay alive next to one torch.compile-based build made after them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import os
import pkgutil
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

import pieceworks
from pieceworks import batch_of, op_names, padded_size
from pieceworks import unpad as _cut  # every tensor whose dim 0 is the padded size, cut back

__all__ = ["Built", "Capabilities", "Implementation", "IMPLEMENTATIONS", "register", "resolve",
           "load_user_implementations"]

InputsMaker = Callable[[int], tuple]


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
    """A built implementation: `fn(*args)` serves a batch. The other fields are what the harness may observe
    (None: not observable)."""

    fn: Callable[..., Any]
    capture_order: list[int] | None = None  # batch sizes in the order their graphs were captured
    pool: Any = None  # the graph pool handle (`torch.cuda.graph_pool_handle()`), for per-pool allocator bytes
    capture_seconds: float | None = None  # wall time of the capture phase
    owner: Any = None  # whatever must stay alive while `fn` is used
    capture_report: dict[str, Any] | None = None  # the implementation's own account of its capture
    compiles: int | None = None  # pieces the build compiled afresh (a warm start from a compile cache: 0)

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


class Implementation:
    """Base adapter. Subclasses set `name`, `capabilities`, `contracts` and implement `build`."""

    name: str = "?"
    capabilities: Capabilities = Capabilities()
    contracts: dict[str, str] = {}  # capability not claimed -> why (the implementation's contract)

    def unavailable_reason(self) -> str | None:
        """None when this implementation can run here; else why not (missing package, no CUDA)."""
        if self.capabilities.needs_cuda and not torch.cuda.is_available():
            return f"{self.name} needs CUDA: torch {torch.__version__} sees no CUDA device"
        return None

    def build(self, model: torch.nn.Module, make_inputs: InputsMaker, capture_sizes: Sequence[int],
              splitting_ops: Sequence[str]) -> Built:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<implementation {self.name}>"


def _missing(module: str) -> ImportError | None:
    """The ImportError of importing `module`, or None when it imports."""
    try:
        importlib.import_module(module)
    except ImportError as exc:
        return exc
    return None


_STATIC_ARGUMENTS = ("{} copies arguments into static input buffers and never back: what the model writes into "
                     "its arguments stays there (models served this way write state such as a KV cache, never "
                     "their inputs)")


def _padded_server(sizes: Sequence[int], static: list[Any], replay: Callable[[int], Any],
                   above: Callable[..., Any]) -> Callable[..., Any]:
    """Serve a batch of b rows as an engine's model runner does: copy it into the first b rows of the max-size
    `static` buffers, `replay(n)` for the smallest captured size n >= b (padded rows hold rows of earlier calls) and
    cut the outputs back to b rows; above the largest size, `above(*args)`."""
    ordered = sorted(sizes)

    def serve(*args: Any) -> Any:
        batch = batch_of(args)
        if (n := padded_size(ordered, batch)) is None:
            return above(*args)
        for buffer, a in zip(static, args):
            if isinstance(a, torch.Tensor):
                buffer[:batch].copy_(a)
        return _cut(replay(n), batch, n)

    return serve


class Eager(Implementation):
    name = "eager"
    contracts = {"cuda_graphs": "runs the model eagerly: no CUDA graphs (the reference the others are compared with)"}

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        return Built(model)


class Pieceworks(Implementation):
    """pieceworks in one CUDA-graph mode, compiled with `compiler` ("inductor" or "eager"), cache in `cache_dir`;
    `config` adds `CompilationConfig` fields."""

    def __init__(self, mode: str, compiler: str = "inductor", cache_dir: str | None = None, **config: Any) -> None:
        self.mode, self.compiler, self.cache_dir, self.config = mode, compiler, cache_dir, config
        graphs = mode != "NONE"
        self.name = f"pieceworks-{mode.lower()}" + ("" if compiler == "inductor" else f"-{compiler}")
        self.capabilities = Capabilities(cuda_graphs=graphs, padding=graphs, shared_pool=graphs,
                                         piecewise=mode in ("PIECEWISE", "FULL_AND_PIECEWISE"),
                                         compile_cache=compiler == "inductor")
        self.contracts = {} if graphs else {"cuda_graphs": "cudagraph_mode NONE: compiled pieces, no CUDA graphs",
                                            "padding": "cudagraph_mode NONE: no graphs, nothing padded",
                                            "shared_pool": "cudagraph_mode NONE: no graphs, no graph pool"}
        if compiler != "inductor":
            self.contracts["compile_cache"] = f"compiler {compiler!r}: nothing compiled with Inductor, nothing cached"

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        config = pieceworks.CompilationConfig(
            splitting_ops=list(splitting_ops), cudagraph_mode=self.mode, compiler=self.compiler,
            cudagraph_capture_sizes=list(capture_sizes), cache_dir=self.cache_dir, **self.config)
        compiled = pieceworks.compile(model, config)

        counters = pieceworks.counters
        before = counters.num_inductor_compiles + counters.num_eager_compiles
        compiled(*make_inputs(min(3, max(capture_sizes))))  # trace and compile
        compiled_now = counters.num_inductor_compiles + counters.num_eager_compiles - before
        start = time.perf_counter()
        report = compiled.capture()
        seconds = time.perf_counter() - start
        runtime = compiled.runtime
        return Built(compiled, capture_order=list(runtime.captured_sizes) or None, pool=runtime.pool.handle,
                     capture_seconds=seconds, owner=compiled, capture_report=report, compiles=compiled_now)


class Inductor(Implementation):
    """`torch.compile(model, **options)`; without options, its defaults (Inductor, no CUDA graphs, automatic dynamic
    shapes). `build` calls every given size `calls` times, largest first, so that compiles (and recordings) happen
    before anyone times the result."""

    name = "inductor"
    contracts = {"cuda_graphs": "torch.compile's defaults: Inductor kernels, no CUDA graphs"}
    options: dict[str, Any] = {}
    calls = 1

    def compile_options(self, splitting_ops: Sequence[str]) -> dict[str, Any]:
        """The keyword arguments of `torch.compile` for a model split at `splitting_ops`."""
        return self.options

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        torch._dynamo.reset()  # an earlier build of the same model with another backend must not serve this one
        sizes = sorted(set(capture_sizes), reverse=True)
        config = torch._dynamo.config  # dynamic=False compiles once per size: let Dynamo keep them all
        config.recompile_limit = max(config.recompile_limit, len(sizes) + 8)
        compiled = torch.compile(model, **self.compile_options(splitting_ops))
        with torch.no_grad():
            for n in sizes:
                inputs = make_inputs(n)
                for _ in range(self.calls):
                    compiled(*inputs)
        if self.capabilities.needs_cuda:
            torch.cuda.synchronize()
        return Built(compiled, owner=compiled)


class _PerSizeRecording(Inductor):
    """`torch.compile(model, dynamic=False, ...)` with CUDA-graph trees: one trace, compile and recording per batch
    size, no padding. Three calls per size: the trees warm up, then record; a size not given compiles and records
    when first called."""

    capabilities = Capabilities(cuda_graphs=True, shared_pool=True, needs_cuda=True)
    contracts = {"padding": "records one CUDA graph per batch size (a new size compiles and records when first called)"
                            " instead of padding",
                 "pool": "CUDA-graph trees keep their pool private to torch: Built.pool is None, pool bytes are not "
                         "observable"}
    calls = 3


class ReduceOverhead(_PerSizeRecording):
    """`torch.compile(model, mode="reduce-overhead", dynamic=False)`: Inductor plus CUDA-graph trees."""

    name = "reduce-overhead"
    options = {"mode": "reduce-overhead", "dynamic": False}


class InductorPartition(_PerSizeRecording):
    """`torch.compile(model, dynamic=False)` with CUDA-graph trees (reduce-overhead's `triton.cudagraphs`) and
    Inductor's graph partition told to keep the splitting ops out of the graphs (`graph_partition`,
    `custom_should_partition_ops`): stock torch.compile as a piecewise runtime, one recording per batch size."""

    name = "inductor-partition"
    capabilities = Capabilities(cuda_graphs=True, piecewise=True, shared_pool=True, needs_cuda=True)

    def unavailable_reason(self) -> str | None:
        if not hasattr(torch._inductor.config, "custom_should_partition_ops"):
            return (f"inductor-partition needs Inductor's custom_should_partition_ops, which torch {torch.__version__} "
                    "lacks. Fix: use a torch with it (2.10 or later)")
        return super().unavailable_reason()

    def compile_options(self, splitting_ops):
        return {"dynamic": False, "options": {"triton.cudagraphs": True, "graph_partition": True,
                                              "custom_should_partition_ops": list(splitting_ops)}}


class _Padded:
    """A per-size recording peer served as an engine's model runner serves one: compiled with automatic dynamic
    shapes (a static compile, a dynamic one, and batch 1's), one CUDA graph recorded per capture size, and every
    batch padded to the next capture size in static buffers (`_padded_server`); above the largest, run as called."""

    capabilities = Capabilities(cuda_graphs=True, padding=True, shared_pool=True, needs_cuda=True)

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        sizes = sorted(set(capture_sizes))
        static = [a.clone() if isinstance(a, torch.Tensor) else a for a in make_inputs(sizes[-1])]

        def views(n: int) -> list[Any]:
            return [a[:n] if isinstance(a, torch.Tensor) else a for a in static]

        built = super().build(model, views, sizes, splitting_ops)
        return Built(_padded_server(sizes, static, lambda n: built(*views(n)), built), owner=(built, static))


class ReduceOverheadPadded(_Padded, ReduceOverhead):
    name = "reduce-overhead-padded"
    options = {"mode": "reduce-overhead"}
    contracts = {"pool": ReduceOverhead.contracts["pool"],
                 "argument_writes": _STATIC_ARGUMENTS.format("the adapter (an engine's model runner)")}


class InductorPartitionPadded(_Padded, InductorPartition):
    name = "inductor-partition-padded"
    capabilities = dataclasses.replace(_Padded.capabilities, piecewise=True)
    contracts = ReduceOverheadPadded.contracts

    def compile_options(self, splitting_ops):
        return {key: value for key, value in super().compile_options(splitting_ops).items() if key != "dynamic"}


class DynamoCudagraphs(_PerSizeRecording):
    """`torch.compile(model, backend="cudagraphs", dynamic=False)`: AOT eager (no Inductor) plus CUDA-graph trees."""

    name = "dynamo-cudagraphs"
    options = {"backend": "cudagraphs", "dynamic": False}


class GraphedCallables(Implementation):
    """`torch.cuda.make_graphed_callables`: one graphed callable per captured size (each in a pool of its own),
    largest first; any other size runs the eager model. The model is passed as a plain function, so torch neither
    replaces its `forward` nor treats its parameters as inputs. Every argument must be a tensor."""

    name = "make-graphed-callables"
    capabilities = Capabilities(cuda_graphs=True, needs_cuda=True)
    contracts = {"padding": "one graphed callable per captured size; other sizes run eagerly: no padding",
                 "shared_pool": "each graphed callable captures into a pool of its own",
                 "argument_writes": _STATIC_ARGUMENTS.format("a graphed callable")}

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        sizes = sorted(set(capture_sizes), reverse=True)
        start = time.perf_counter()
        with torch.no_grad():
            graphed = {n: torch.cuda.make_graphed_callables(lambda *args: model(*args), tuple(make_inputs(n)))
                       for n in sizes}
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start

        def serve(*args: Any) -> Any:
            return graphed.get(batch_of(args), model)(*args)

        return Built(serve, capture_order=sizes, capture_seconds=seconds, owner=graphed)


class _NoGraphBreaks(torch.overrides.TorchFunctionMode):
    """While active, every call of a splitting op goes through `no_graph` (Meta pcg's eager break)."""

    def __init__(self, splitting_ops: Sequence[str], no_graph: Callable[..., Any]) -> None:
        super().__init__()
        self.splitting_ops, self.no_graph, self.breaks = set(splitting_ops), no_graph, 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if op_names(func) & self.splitting_ops:
            self.breaks += 1
            return self.no_graph(func)(*args, **(kwargs or {}))
        return func(*args, **(kwargs or {}))


class MetaPCG(Implementation):
    """Meta's compiler-free piecewise CUDA graphs, `breakable-cuda-graphs` ("breakable") or its predecessor
    `piecewise-cuda-graphs` ("meta-pcg"), both on PyPI with one API under two sets of names: the eager model captured
    per batch size as a sequence of CUDA graphs with the splitting ops run eagerly between them (its `no_graph`), all
    sizes in one pool, largest first, on one side stream after a warm-up there; served by `_padded_server`. The
    splitting ops must write into buffers they are given and return no CUDA tensor (the package's rule); non-tensor
    arguments must equal the example's."""

    capabilities = Capabilities(cuda_graphs=True, padding=True, piecewise=True, shared_pool=True, needs_cuda=True)
    contracts = {"argument_writes": _STATIC_ARGUMENTS.format("the adapter (an engine's model runner)")}

    def __init__(self, name: str = "meta-pcg", module: str = "piecewise_cuda_graphs",
                 sequence: str = "CUDAGraphSequence", capture: str = "piecewise_graph") -> None:
        self.name, self.module, self.sequence, self.capture = name, module, sequence, capture

    def unavailable_reason(self) -> str | None:
        if _missing(self.module):
            package = self.module.replace("_", "-")
            return (f"{self.name} needs Meta's {package} (PyPI, pure Python), which is not installed. Fix: "
                    f"pip install 'pieceworks[pcg]' (or pip install {package})")
        return super().unavailable_reason()

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        pcg = importlib.import_module(self.module)
        new_sequence, capture = getattr(pcg, self.sequence), getattr(pcg, self.capture)

        sizes = sorted(set(capture_sizes), reverse=True)
        static = [a.clone() if isinstance(a, torch.Tensor) else a for a in make_inputs(sizes[0])]

        def views(n: int) -> list[Any]:
            return [a[:n] if isinstance(a, torch.Tensor) else a for a in static]

        stream, pool = torch.cuda.Stream(), torch.cuda.graph_pool_handle()
        # The warm-up makes the capture stream's cuBLAS workspace, which every captured GEMM keeps using. In a
        # MemPool of its own it stays mapped when other code (reduce-overhead's graph trees) clears cuBLAS
        # workspaces and empties the cache; in the default pool it would be freed under the graphs.
        warmup_pool = torch.cuda.MemPool()
        captured: dict[int, tuple[Any, Any]] = {}
        start = time.perf_counter()
        with torch.no_grad():
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), torch.cuda.use_mem_pool(warmup_pool):  # workspaces of the capture stream
                for n in sizes:
                    model(*views(n))
            torch.cuda.current_stream().wait_stream(stream)
            for n in sizes:
                seq, breaks = new_sequence(pool=pool), _NoGraphBreaks(splitting_ops, pcg.no_graph)
                with capture(seq, stream=stream), breaks:
                    out = model(*views(n))
                if not breaks.breaks and splitting_ops:
                    raise RuntimeError(f"{self.name}: no call of {list(splitting_ops)} seen while capturing batch {n}")
                captured[n] = (seq, out)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start

        def replay(n: int) -> Any:
            seq, out = captured[n]
            seq.replay()
            return out

        return Built(_padded_server(sizes, static, replay, model), capture_order=sizes, pool=pool,
                     capture_seconds=seconds, owner=(captured, warmup_pool))


class VLLM(Implementation):
    """vLLM's compilation backend, driven as vLLM's model runner drives it: the model behind `@support_torch_compile`
    (at most 4 tensor arguments, dim 0 dynamic) under a `VllmConfig` with `CompilationMode.VLLM_COMPILE`, PIECEWISE
    graphs, the splitting ops and capture sizes; each call under `set_forward_context` with the runtime mode and a
    `BatchDescriptor(num_tokens=n)`. `build` compiles with one run under NONE, then captures each size largest
    first; served by `_padded_server`, above the largest size under NONE. Written against vLLM's 0.11 API."""

    name = "vllm"
    capabilities = Capabilities(cuda_graphs=True, padding=True, piecewise=True, shared_pool=True, needs_cuda=True)
    contracts = {"pool": "vLLM captures into one graph pool global to the process "
                         "(current_platform.get_global_graph_pool()): not observable per model",
                 "compile_cache": "vLLM keeps its own compile cache (~/.cache/vllm/torch_compile_cache); this adapter "
                                  "does not observe its compiles",
                 "argument_writes": _STATIC_ARGUMENTS.format("vLLM's model runner")}

    def unavailable_reason(self) -> str | None:
        exc = _missing("vllm")
        if exc:
            return (f"vllm is not importable here ({exc}). vLLM pins a torch build of its own and is installed from "
                    "the network, so it cannot be installed on a machine without network access. Fix: pip "
                    "install vllm in an environment whose torch is the one vLLM pins, and run there")
        return super().unavailable_reason()

    def build(self, model, make_inputs, capture_sizes, splitting_ops):
        from vllm.compilation.decorators import support_torch_compile
        from vllm.config import CompilationConfig, CompilationMode, CUDAGraphMode, VllmConfig, set_current_vllm_config
        from vllm.forward_context import BatchDescriptor, set_forward_context

        sizes = sorted(set(capture_sizes))
        static = [a.clone() for a in make_inputs(sizes[-1])]
        if len(static) > 4:
            raise ValueError(f"the vllm adapter takes models of at most 4 tensor arguments, not {len(static)}")
        vllm_config = VllmConfig(compilation_config=CompilationConfig(
            mode=CompilationMode.VLLM_COMPILE, cudagraph_mode=CUDAGraphMode.PIECEWISE,
            splitting_ops=list(splitting_ops), cudagraph_capture_sizes=sizes))

        class Wrapped(torch.nn.Module):
            def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
                super().__init__()
                self.inner = model

            def forward(self, a0, a1=None, a2=None, a3=None):
                return self.inner(*(a0, a1, a2, a3)[:len(static)])

        with set_current_vllm_config(vllm_config):
            dims = {f"a{i}": 0 for i in range(len(static))}
            compiled = support_torch_compile(dynamic_arg_dims=dims)(Wrapped)(vllm_config=vllm_config, prefix="")

        def run(args: Sequence[Any], n: int | None) -> Any:
            mode = CUDAGraphMode.NONE if n is None else CUDAGraphMode.PIECEWISE
            with set_current_vllm_config(vllm_config), set_forward_context(
                    None, vllm_config, cudagraph_runtime_mode=mode,
                    batch_descriptor=None if n is None else BatchDescriptor(num_tokens=n)):
                return compiled(*args)

        def replay(n: int) -> Any:
            return run([s[:n] for s in static], n)

        start = time.perf_counter()
        with torch.no_grad():
            run(static, None)  # trace and compile
            for n in reversed(sizes):
                replay(n)
        if static[0].is_cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        return Built(_padded_server(sizes, static, replay, lambda *args: run(args, None)),
                     capture_order=sizes[::-1], capture_seconds=seconds, owner=(compiled, static))


IMPLEMENTATIONS: dict[str, Implementation] = {}


def register(impl: Implementation) -> Implementation:
    """Add `impl` to the registry under `impl.name` (a later registration of the same name replaces it)."""
    IMPLEMENTATIONS[impl.name] = impl
    return impl


for _impl in [Eager(), Inductor(), ReduceOverhead(), InductorPartition(), DynamoCudagraphs(), GraphedCallables(),
              *(Pieceworks(m) for m in ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")),
              ReduceOverheadPadded(), InductorPartitionPadded(), MetaPCG(),
              MetaPCG("breakable", "breakable_cuda_graphs", "BreakableCUDAGraph", "breakable_graph"), VLLM()]:
    register(_impl)


def _load_file(path: str) -> Any:
    """The module of file `path`, loaded once per path (under its stem and a hash of the path)."""
    path = os.path.abspath(path)
    if not os.path.isfile(path):
        raise ImportError(f"no file {path}. Fix: name an existing .py file, or write 'package.module:Adapter'")
    name = f"pieceworks_user_{os.path.basename(path)[:-3]}_{hashlib.sha1(path.encode()).hexdigest()[:8]}"
    if name not in sys.modules:
        file_spec = importlib.util.spec_from_file_location(name, path)
        sys.modules[name] = importlib.util.module_from_spec(file_spec)
        try:
            file_spec.loader.exec_module(sys.modules[name])
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


def resolve(spec: str) -> Implementation:
    """A registered name, or `package.module:Attribute` or `path/to/file.py:Attribute` naming an `Implementation`
    instance or subclass (a subclass is instantiated). Raises KeyError, ImportError, AttributeError or TypeError,
    each naming `spec` and the fix."""
    if spec in IMPLEMENTATIONS:
        return IMPLEMENTATIONS[spec]
    if ":" not in spec:
        raise KeyError(f"unknown implementation {spec!r}; registered: {sorted(IMPLEMENTATIONS)}. Fix: pass one of "
                       f"those, or 'package.module:Adapter' for your own (a pieceworks.harness.implementations."
                       f"Implementation)")
    module_name, _, attr = spec.rpartition(":")
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            target = getattr(_load_file(module_name), attr)
        else:
            target = pkgutil.resolve_name(spec)
    except ImportError as exc:
        raise ImportError(f"implementation {spec!r}: cannot import module {module_name!r} ({exc}). Fix: make it "
                          f"importable (installed, or its folder on PYTHONPATH) and write 'package.module:Adapter', "
                          f"or give its file: 'path/to/file.py:Adapter'") from exc
    except AttributeError as exc:
        raise AttributeError(f"implementation {spec!r}: {exc}. Fix: name an Implementation instance or subclass "
                             f"defined there") from None
    impl = target() if isinstance(target, type) else target
    if not isinstance(impl, Implementation):
        raise TypeError(f"{spec} is a {type(impl).__name__}, not a pieceworks.harness.implementations.Implementation")
    return impl


def load_user_implementations(specs: str | None = None) -> list[Implementation]:
    """Resolve and register users' implementations: comma-separated `package.module:Attribute` paths in `specs`
    (default: $PIECEWORKS_IMPLEMENTATIONS). Returns them, in order. Each registers under its own `name` (replacing
    a built-in of the same name); a path that does not resolve raises, naming it."""
    if specs is None:
        specs = os.environ.get("PIECEWORKS_IMPLEMENTATIONS", "")
    found = []
    for spec in filter(None, (s.strip() for s in specs.split(","))):
        if ":" not in spec:
            raise ValueError(f"PIECEWORKS_IMPLEMENTATIONS entry {spec!r} is not a 'package.module:Adapter' path. Fix: "
                             f"write the module and the Implementation's name separated by ':'")
        found.append(register(resolve(spec)))
    return found
