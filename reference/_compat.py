"""Every private torch API the core uses, in one place, each feature-detected for torch 2.11-2.15 (the model
layer's own, Dynamo's trace facts and the graph pickler, are in `pieceworks.model._compat`, found with
`require`).

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
- the shape environment: a FakeTensor's `fake_mode`, a SymInt's `str()` naming its expression, and
  `torch.fx.experimental.symbolic_shapes.free_unbacked_symbols` (same name and meaning in 2.11-2.15);
- the global compiler configuration: the modules `torch._inductor.config` and `torch._functorch.config`
  (`get_config_copy`, `save_config_portable`, `patch`; all three in 2.11-2.15), read for the cache key and for
  checking `inductor_compile_config` keys (and values, against each option's declared type: `_config[key]
  .value_type`), patched only for the duration of one compile;
- Inductor's default cache folder, `torch._inductor.runtime.cache_dir_utils.default_cache_dir()` (2.11-2.15);
- a SymInt's sympy expression, `SymInt.node.expr` (2.11-2.15), to evaluate a size at one batch size;
- the caching allocator's capture routing, `torch._C._cuda_endAllocateToPool(device, pool)` and
  `_cuda_releasePool(device, pool)` (2.11-2.15; `torch.cuda.use_mem_pool` calls them): a capture whose
  `capture_end` raises (the stream capture was invalidated: a host sync, a failed launch) never reaches them,
  and the allocator would keep routing to the pool and assert when it next frees, and the CUDA generators
  would stay in capture mode (`end_failed_capture`).

A missing feature raises `TorchCompatError` once, at first use, naming the feature, the torch version and the
fix (`require`); nothing here patches torch.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable
from typing import Any

import torch
import torch.fx


class TorchCompatError(RuntimeError):
    """This torch lacks a private API pieceworks needs (pieceworks supports torch 2.11-2.15)."""


def _missing(feature: str) -> TorchCompatError:
    return TorchCompatError(
        f"pieceworks needs {feature}, which torch {torch.__version__} does not have. "
        f"pieceworks supports torch 2.11-2.15. Fix: install a torch in that range"
    )


def require(name: str, *features: str) -> Any:
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
    inductor = require("torch._inductor", "standalone_compile")
    return inductor.standalone_compile(gm, example_args, dynamic_shapes=dynamic_shapes, options=options)


def load_artifact(path: str) -> Any:
    """`torch._inductor.CompiledArtifact.load(path=, format="binary")`."""
    inductor = require("torch._inductor", "CompiledArtifact.load")
    return inductor.CompiledArtifact.load(path=path, format="binary")


def inductor_events() -> Any:
    """Inductor's event counts (`torch._dynamo.utils.counters["inductor"]`, a Counter):
    `fxgraph_lookup_write_file` counts FX-graph cache hits whose code Inductor had to write out again,
    building the kernels it calls."""
    return require("torch._dynamo.utils", "counters").counters["inductor"]


def cpu_vec_isa() -> Any:
    """The module `torch._inductor.cpu_vec_isa`: Inductor's probe of the CPU's vector ISAs
    (`valid_vec_isa_list`, cached a process), the ISAs it knows and the CPU's flags (`x86_isa_checker`)."""
    names = ("valid_vec_isa_list", "x86_isa_checker", "supported_vec_isa_list")
    return require("torch._inductor.cpu_vec_isa", *names)


def cpp_compiler_version() -> str:
    """The C++ compiler Inductor builds CPU kernels with, and its version line (`cpp_builder`)."""
    builder = require("torch._inductor.cpp_builder", "get_cpp_compiler", "get_compiler_version_info")
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
    split = require("torch.fx.passes.split_module", "split_module").split_module
    return split(gm, gm, callback, keep_original_order=keep_original_order)


def fake_mode_of(values: list[Any]) -> Any:
    """The FakeTensorMode (hence the shape environment) of the first FakeTensor in `values`, or None."""
    return next((v.fake_mode for v in values if hasattr(v, "fake_mode")), None)


def symbol_name(value: Any) -> str | None:
    """The expression of a SymInt as a string (`"s0"`), None for anything else."""
    return str(value) if isinstance(value, torch.SymInt) else None


def unbacked_symbols(value: Any) -> set[str]:
    """The names of the data-dependent (unbacked) symbols in a FakeTensor's sizes or a SymInt (`{"u0"}`)."""
    shapes = require("torch.fx.experimental.symbolic_shapes", "free_unbacked_symbols")
    return {str(s) for s in shapes.free_unbacked_symbols(value)}


def registered_ops() -> list[str]:
    """Every op name the dispatcher knows ("ns::op.overload"), for error messages; empty where torch cannot
    list them (then messages just list fewer candidates)."""
    return list(getattr(torch._C, "_dispatch_get_all_op_names", list)())  # absent: `list()`, no names


def inductor_config() -> Any:
    """The module `torch._inductor.config` (Inductor's global configuration)."""
    return require("torch._inductor.config", "get_config_copy", "save_config_portable", "patch")


def inductor_option_type(key: str) -> Any:
    """The type Inductor declares for option `key` (`torch._inductor.config._config[key].value_type`,
    2.11-2.15), or None where this torch does not say."""
    return getattr(getattr(inductor_config(), "_config", {}).get(key), "value_type", None)


def functorch_config() -> Any:
    """The module `torch._functorch.config` (AOTAutograd's global configuration, part of what Inductor keys
    on)."""
    return require("torch._functorch.config", "save_config_portable")


def inductor_default_cache_dir() -> str:
    """The folder Inductor caches in when `TORCHINDUCTOR_CACHE_DIR` is unset."""
    return require("torch._inductor.runtime.cache_dir_utils", "default_cache_dir").default_cache_dir()


def evaluate_at(value: Any, size: int) -> int:
    """An int, or a SymInt's expression with every free symbol set to `size` (the batch size of a static
    compile): `SymInt.node.expr` is a sympy expression."""
    return int(value.node.expr.xreplace(dict.fromkeys(value.node.expr.free_symbols, size)))


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
