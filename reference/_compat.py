"""Every private torch API pieceworks uses, in one place, each feature-detected for torch 2.11-2.15.

What is private, and what the versions differ in (checked against the 2.11, 2.13 and 2.15 sources):
- `torch._inductor.standalone_compile(gm, args, *, dynamic_shapes=, options=)` and
  `CompiledArtifact.save/load`: the same keywords in 2.11-2.15 (2.13 adds `fake_mode`, `donate_graph_module`;
  unused here);
- a node's FakeTensor: Dynamo writes `meta["example_value"]`, AOT/export passes `meta["val"]`; read either;
- the dispatcher's op list `torch._C._dispatch_get_all_op_names` (for error messages; empty where absent);
- op identity: `torch._ops.OpOverload` (`_schema`, `_overloadname`) and `OpOverloadPacket`
  (`_qualified_op_name`), unchanged over 2.11-2.15;
- `torch.fx.passes.split_module.split_module(..., keep_original_order=)`: present in all; `tuple_return` only
  2.13+ (not used: a single-output piece returns a bare value and callers handle both);
- Dynamo's `torch._dynamo.config.patch(capture_scalar_outputs=, capture_dynamic_output_shape_ops=)`: both
  flags in 2.11-2.15 (newer Dynamo implies them under fullgraph=True; setting them keeps every version alike);
- the shape environment: a FakeTensor's `fake_mode`, a SymInt's `str()` naming its expression, and
  `torch.fx.experimental.symbolic_shapes.free_unbacked_symbols` (same name and meaning in 2.11-2.15);
- the global compiler configuration: the modules `torch._inductor.config` and `torch._functorch.config`
  (`get_config_copy`, `save_config_portable`, `patch`; all three in 2.11-2.15), read for the cache key and for
  checking `inductor_compile_config` keys (and values, against each option's declared type: `_config[key]
  .value_type`), patched only for the duration of one compile;
- Inductor's default cache folder, `torch._inductor.runtime.cache_dir_utils.default_cache_dir()` (2.11-2.15;
  None where absent: callers fall back to the folder's name);
- Dynamo's `torch._dynamo.exc.BackendCompilerFailed`, which wraps an error raised inside a backend;
- a SymInt's sympy expression, `SymInt.node.expr` (2.11-2.15), to evaluate a size at one batch size;
- for a warm start without tracing (record.py): the code objects Dynamo traced, `TracingContext.traced_code`
  (2.11-2.15); Dynamo's configuration (`save_config_portable`) and nn.Module's global forward hooks, for its
  key; `torch.fx._graph_pickler.GraphPickler` (`dumps`, `loads(data, fake_mode)`, `Options(ops_filter=)`),
  which pickles a Dynamo graph with its FakeTensor and SymInt metadata; torch's own sympy functions pickle by
  `_torch_unpickler`, and a fake mode is not pickled (the loader supplies a fresh one); the graph is rebuilt
  under `torch._guards.tracing(TracingContext(fake_mode))`, as a backend call would be. Where any of this is
  missing or fails, the record is not written and warm starts trace as before;
- the caching allocator's capture routing, `torch._C._cuda_endAllocateToPool(device, pool)` and
  `_cuda_releasePool(device, pool)` (2.11-2.15; `torch.cuda.use_mem_pool` calls them): a capture whose
  `capture_end` raises (the stream capture was invalidated: a host sync, a failed launch) never reaches them,
  and the allocator would keep routing to the pool and assert when it next frees, and the CUDA generators
  would stay in capture mode (`end_failed_capture`);
- `nn.Module._apply(fn)`, through which `.to()`, `.cuda()`, `.half()` reallocate parameters and buffers (no
  public hook sees it): the watched class of watch.py overrides it (2.11-2.15);
  `torch.utils.hooks.RemovableHandle.next_id`, the count of hook handles torch has handed out (every hook
  registration moves it; 2.11-2.15), and nn.Module's global forward hooks, for `StateWatch`.

A missing feature raises `TorchCompatError` once, at first use (`BackendCompilerFailed`, `HookHandle`: at
import), naming the feature, the torch version and the fix; nothing here patches torch.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import warnings
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.fx


class TorchCompatError(RuntimeError):
    """This torch lacks a private API pieceworks needs (pieceworks supports torch 2.11-2.15)."""


def _missing(feature: str) -> TorchCompatError:
    return TorchCompatError(
        f"pieceworks needs {feature}, which torch {torch.__version__} does not have. "
        f"pieceworks supports torch 2.11-2.15. Fix: install a torch in that range"
    )


def _module(name: str, *features: str) -> Any:
    """The module `name`, having each (dotted) attribute in `features`; else `TorchCompatError` naming what is
    missing."""
    try:
        module: Any = importlib.import_module(name)
    except ImportError:
        raise _missing(name) from None
    for feature in features:
        if functools.reduce(lambda obj, attr: getattr(obj, attr, None), feature.split("."), module) is None:
            raise _missing(f"{name}.{feature}")
    return module


def standalone_compile(
    gm: torch.fx.GraphModule, example_args: list[Any], dynamic_shapes: str, options: dict[str, Any]
) -> Any:
    """`torch._inductor.standalone_compile`: a `CompiledArtifact` (callable, `.save(path=, format=)`)."""
    inductor = _module("torch._inductor", "standalone_compile")
    return inductor.standalone_compile(gm, example_args, dynamic_shapes=dynamic_shapes, options=options)


def load_artifact(path: str) -> Any:
    """`torch._inductor.CompiledArtifact.load(path=, format="binary")`."""
    inductor = _module("torch._inductor", "CompiledArtifact.load")
    return inductor.CompiledArtifact.load(path=path, format="binary")


def inductor_events() -> Any:
    """Inductor's event counts (`torch._dynamo.utils.counters["inductor"]`, a Counter):
    `fxgraph_lookup_write_file` counts FX-graph cache hits whose code Inductor had to write out again,
    building the kernels it calls."""
    return _module("torch._dynamo.utils", "counters").counters["inductor"]


def cpu_vec_isa() -> Any:
    """The module `torch._inductor.cpu_vec_isa`: Inductor's probe of the CPU's vector ISAs
    (`valid_vec_isa_list`, cached a process), the ISAs it knows and the CPU's flags (`x86_isa_checker`)."""
    return _module(
        "torch._inductor.cpu_vec_isa", "valid_vec_isa_list", "x86_isa_checker", "supported_vec_isa_list"
    )


def cpp_compiler_version() -> str:
    """The C++ compiler Inductor builds CPU kernels with, and its version line (`cpp_builder`)."""
    builder = _module("torch._inductor.cpp_builder", "get_cpp_compiler", "get_compiler_version_info")
    compiler = builder.get_cpp_compiler()
    return f"{compiler}: {builder.get_compiler_version_info(compiler)}"


def example_value(node: torch.fx.Node) -> Any:
    """The FakeTensor/SymInt a node was traced with: Dynamo's `example_value`, else `val`, else None."""
    return node.meta["example_value"] if "example_value" in node.meta else node.meta.get("val")


def op_identity(target: Any) -> tuple[str, str | None] | None:
    """`("ns::op", overload)` for a torch op: overload None for a packet (`torch.ops.ns.op`), its name
    (`"default"` for the default) for an `OpOverload`; None for anything that is not a torch op."""
    if isinstance(target, torch._ops.OpOverloadPacket):
        return target._qualified_op_name, None
    if isinstance(target, torch._ops.OpOverload):
        return target._schema.name, target._overloadname or "default"
    return None


def op_schema(target: Any) -> Any:
    """The schema of a torch op (a packet's default overload), or None: what its arguments alias and write."""
    if isinstance(target, torch._ops.OpOverloadPacket):
        target = getattr(target, "default", None)
    return target._schema if isinstance(target, torch._ops.OpOverload) else None


def split_module(
    gm: torch.fx.GraphModule, callback: Callable[[Any], int], keep_original_order: bool
) -> torch.fx.GraphModule:
    """`torch.fx.passes.split_module.split_module(gm, gm, callback, keep_original_order=...)`: `gm` is its own
    root module."""
    split = _module("torch.fx.passes.split_module", "split_module").split_module
    return split(gm, gm, callback, keep_original_order=keep_original_order)


def data_dependent_tracing() -> Any:
    """A context in which Dynamo keeps data-dependent ops (`.item()`, `nonzero`) in its graph instead of
    breaking."""
    config = _module("torch._dynamo.config", "capture_dynamic_output_shape_ops")
    return config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True)


def fake_mode_of(values: list[Any]) -> Any:
    """The FakeTensorMode (hence the shape environment) of the first FakeTensor in `values`, or None."""
    return next((v.fake_mode for v in values if hasattr(v, "fake_mode")), None)


def symbol_name(value: Any) -> str | None:
    """The expression of a SymInt as a string (`"s0"`), None for anything else."""
    return str(value) if isinstance(value, torch.SymInt) else None


def unbacked_symbols(value: Any) -> set[str]:
    """The names of the data-dependent (unbacked) symbols in a FakeTensor's sizes or a SymInt (`{"u0"}`)."""
    shapes = _module("torch.fx.experimental.symbolic_shapes", "free_unbacked_symbols")
    return {str(s) for s in shapes.free_unbacked_symbols(value)}


def registered_ops() -> list[str]:
    """Every op name the dispatcher knows ("ns::op.overload"), for error messages; empty where torch cannot
    list them (then messages just list fewer candidates)."""
    return list(getattr(torch._C, "_dispatch_get_all_op_names", list)())  # absent: `list()`, no names


def inductor_config() -> Any:
    """The module `torch._inductor.config` (Inductor's global configuration)."""
    return _module("torch._inductor.config", "get_config_copy", "save_config_portable", "patch")


def inductor_option_type(key: str) -> Any:
    """The type Inductor declares for option `key` (`torch._inductor.config._config[key].value_type`,
    2.11-2.15), or None where this torch does not say."""
    return getattr(getattr(inductor_config(), "_config", {}).get(key), "value_type", None)


def functorch_config() -> Any:
    """The module `torch._functorch.config` (AOTAutograd's global configuration, part of what Inductor keys
    on)."""
    return _module("torch._functorch.config", "save_config_portable")


def inductor_default_cache_dir() -> str | None:
    """The folder Inductor caches in when `TORCHINDUCTOR_CACHE_DIR` is unset, or None where this torch does
    not say."""
    with contextlib.suppress(TorchCompatError):
        return _module("torch._inductor.runtime.cache_dir_utils", "default_cache_dir").default_cache_dir()
    return None


# Checked at import (every torch 2.11-2.15 has it): callers name it in `except` clauses.
BackendCompilerFailed = _module("torch._dynamo.exc", "BackendCompilerFailed").BackendCompilerFailed
# Checked at import: a call reads `HookHandle.next_id` (hooks handed out so far), so it must not cost a
# lookup.
HookHandle = _module("torch.utils.hooks", "RemovableHandle.next_id").RemovableHandle


def evaluate_at(value: Any, size: int) -> int:
    """An int, or a SymInt's expression with every free symbol set to `size` (the batch size of a static
    compile): `SymInt.node.expr` is a sympy expression."""
    return int(value.node.expr.xreplace(dict.fromkeys(value.node.expr.free_symbols, size)))


def traced_code() -> list[Any] | None:
    """The code objects Dynamo traced for the graph being compiled (call inside a backend), or None where
    this torch does not list them."""
    codes = getattr(torch._guards.TracingContext.try_get(), "traced_code", None)
    return None if codes is None else list(codes)


def dynamo_config() -> dict[str, Any]:
    """Dynamo's configuration as `save_config_portable()` gives it: what can change a trace."""
    return _module("torch._dynamo.config", "save_config_portable").save_config_portable()


def global_module_hooks() -> bool:
    """Whether forward hooks are registered for every module (`register_module_forward_hook` and its
    pre-hook)."""
    module = torch.nn.modules.module
    return any(getattr(module, name, None) for name in ("_global_forward_hooks", "_global_forward_pre_hooks"))


def pickle_graph(gm: torch.fx.GraphModule) -> bytes:
    """A Dynamo graph with its FakeTensor/SymInt metadata as bytes (`unpickle_graph` reverses it); raises
    where this torch cannot pickle it."""
    import sympy

    pickler = _module("torch.fx._graph_pickler", "GraphPickler", "Options")
    fake_mode = _module("torch._subclasses", "FakeTensorMode").FakeTensorMode
    graph_pickler: Any = pickler.GraphPickler  # typed Any: mypy takes no other variable as a base class

    class Pickler(graph_pickler):
        def reducer_override(self, obj: object) -> Any:
            if isinstance(obj, type) and issubclass(obj, sympy.Function) and hasattr(obj, "_torch_unpickler"):
                return obj._torch_unpickler, (cast(Any, obj)._torch_handler_name,)
            if isinstance(obj, fake_mode):  # the loader supplies its own
                return type(None), ()
            return super().reducer_override(obj)

    return Pickler.dumps(gm, pickler.Options(ops_filter=None))


def unpickle_graph(data: bytes) -> tuple[torch.fx.GraphModule, Any]:
    """`(graph, fake_mode)`: a graph `pickle_graph` wrote, its metadata in a fresh FakeTensorMode and shape
    environment."""
    shape_env = _module("torch.fx.experimental.symbolic_shapes", "ShapeEnv").ShapeEnv()
    fake_mode = _module("torch._subclasses", "FakeTensorMode").FakeTensorMode(shape_env=shape_env)
    return _module("torch.fx._graph_pickler", "GraphPickler").GraphPickler.loads(data, fake_mode), fake_mode


def tracing(fake_mode: Any) -> Any:
    """The context a backend runs in (`torch._guards.tracing(TracingContext(fake_mode))`), for rebuilding a
    graph outside Dynamo."""
    guards = _module("torch._guards", "tracing", "TracingContext")
    return guards.tracing(guards.TracingContext(fake_mode))


def end_failed_capture(pool: Any) -> None:
    """Undo what `CUDAGraph.capture_begin(pool=pool)` told the caching allocator, after a `capture_end`
    that raised: stop routing this device's allocations to `pool` and drop the capture's hold on it."""
    device = torch.cuda.current_device()
    torch._C._cuda_endAllocateToPool(device, pool)
    torch._C._cuda_releasePool(device, pool)
    # The CUDA generators the capture registered never reached their capture epilogue either and still count
    # offsets as captured (a later random op raises): an empty capture runs their prologue and epilogue.
    with warnings.catch_warnings(), torch.cuda.stream(torch.cuda.Stream()):
        warnings.simplefilter("ignore")  # "The CUDA Graph is empty"
        empty = torch.cuda.CUDAGraph()
        empty.capture_begin()
        empty.capture_end()
