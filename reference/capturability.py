"""Can a piece be captured in a CUDA graph, and which of its inputs can move? Decided from the graph, before capture.

As PyTorch's dynamo `cudagraphs` backend does, a piece is refused (it then runs without a graph, logged once with
the reason and the node) when it has CPU tensors (0-d scalars aside), tensors on several devices, ops that
synchronise with the host (`.item()`, `nonzero`, ...), or mutates an input whose address is not fixed (an output of
a splitting op, allocated anew on every call).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
import torch.fx

from ._compat import example_value, op_identity, op_schema, unbacked_symbols
from .values import tensors_in

__all__ = ["uncapturable_reason", "input_provenance", "mutated_inputs", "data_dependent_sizes"]

_SYNC_METHODS = {"item", "tolist", "cpu", "numpy", "nonzero", "unique", "masked_select"}
_SYNC_NAMES = {"_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "unique_consecutive",
               "item", "tolist", "repeat_interleave", "bincount", "histc"}
_INPLACE_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
                      operator.imod, operator.ipow, operator.iand, operator.ior, operator.ixor, operator.setitem}
_VIEW_METHODS = {"view", "reshape", "transpose", "permute", "expand", "narrow", "select", "unsqueeze", "squeeze",
                 "flatten", "unflatten", "split", "chunk", "t", "as_strided", "view_as", "unbind", "diagonal"}


def _op_name(node: torch.fx.Node) -> str:
    """The bare op name (`nonzero` for `aten::nonzero.default`), a method's name, or a function's `__name__`."""
    target = node.target
    if isinstance(target, str):
        return target
    identity = op_identity(target)
    if identity is not None:
        return identity[0].split("::")[-1]
    return getattr(target, "__name__", str(target))


def _is_inplace(node: torch.fx.Node) -> bool:
    if node.op == "call_method":
        return node.target.endswith("_") and not node.target.endswith("__")
    if node.op != "call_function":
        return False
    if node.target in _INPLACE_OPERATORS or "out" in node.kwargs:
        return True
    schema = op_schema(node.target)
    if schema is not None:
        return any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
    name = getattr(node.target, "__name__", "")
    return name.endswith("_") and not name.endswith("__")


def _base_placeholder(node: Any) -> torch.fx.Node | None:
    """The placeholder `node` is (a view of), following getitem and view-like ops."""
    while isinstance(node, torch.fx.Node):
        if node.op == "placeholder":
            return node
        viewish = (node.op == "call_method" and node.target in _VIEW_METHODS) or (
            node.op == "call_function" and node.target is operator.getitem
        )
        if not viewish:
            return None
        node = node.args[0]
    return None


def _mutated_args(node: torch.fx.Node) -> list[Any]:
    if node.op == "call_method" or node.target in _INPLACE_OPERATORS:
        return [node.args[0]]
    if "out" in node.kwargs:
        out = node.kwargs["out"]
        return list(out) if isinstance(out, (tuple, list)) else [out]
    schema = op_schema(node.target)
    if schema is not None:
        mutated = []
        for i, a in enumerate(schema.arguments):
            if a.alias_info is not None and a.alias_info.is_write:
                mutated.append(node.args[i] if i < len(node.args) else node.kwargs.get(a.name))
        return mutated
    return [node.args[0]] if node.args else []


def mutated_inputs(gm: torch.fx.GraphModule) -> set[int]:
    """Indices of `gm`'s placeholders that some node writes to in place (directly or through a view)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    written = set()
    for node in gm.graph.nodes:
        if _is_inplace(node):
            for arg in _mutated_args(node):
                base = _base_placeholder(arg)
                if base is not None:
                    written.add(placeholders.index(base))
    return written


def data_dependent_sizes(gm: torch.fx.GraphModule) -> list[str]:
    """The data-dependent (unbacked) symbols in `gm`'s traced values, e.g. `u0` from `.item()`, `nonzero` or a
    splitting op whose fake impl calls `new_dynamic_size()`; sorted, empty when every size is known from the batch.
    A CUDA graph or a static compile would bake in the value one call saw."""
    found = set()
    for node in gm.graph.nodes:
        value = example_value(node)
        for v in tensors_in(value) or ([value] if isinstance(value, (torch.SymInt, torch.SymFloat)) else []):
            found |= unbacked_symbols(v)
    return sorted(found)


def uncapturable_reason(gm: torch.fx.GraphModule, example_args: Sequence[Any], moving_inputs: set[int]) -> str | None:
    """Why `gm` cannot be captured, naming the node; None if it can.

    `moving_inputs`: indices of inputs whose address changes between calls (outputs of splitting ops).
    """
    devices = set()
    for t in (t for a in example_args for t in tensors_in(a)):
        devices.add(t.device)
    for node in gm.graph.nodes:
        for t in tensors_in(example_value(node)):
            devices.add(t.device)
            if t.device.type == "cpu" and t.dim() > 0:
                return f"node {node.name} ({node.format_node()}) makes a CPU tensor"
        name = _op_name(node)
        if (node.op == "call_method" and node.target in _SYNC_METHODS) or (
            node.op == "call_function" and name in _SYNC_NAMES
        ):
            return f"node {node.name} ({node.format_node()}) synchronises with the host"
    symbols = data_dependent_sizes(gm)
    if symbols:
        return f"its sizes depend on data ({', '.join(symbols)}), which a CUDA graph would bake in"
    cuda_devices = {d for d in devices if d.type == "cuda"}
    if not cuda_devices:
        return "no CUDA tensors"
    if len(cuda_devices) > 1:
        return f"tensors on several devices {sorted(map(str, cuda_devices))}"
    if any(d.type == "cpu" for d in devices) and not all(
        t.dim() == 0 for a in example_args for t in tensors_in(a) if t.device.type == "cpu"
    ):
        return "CPU tensor inputs"
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i in sorted(mutated_inputs(gm) & moving_inputs):
        return (
            f"it mutates input {i} ({placeholders[i].name}), which a splitting op allocates anew on every call: "
            f"a replay would write to a stale address"
        )
    return None


def input_provenance(split_gm: torch.fx.GraphModule, submod_name: str, splitting_names: set[str]) -> list[str]:
    """For each argument of the call to `submod_name` in the stitching graph: "param", "input", "piece" or "split".

    "param": a parameter or buffer (fixed address). "input": a graph input the caller owns. "piece": an output of a
    compiled piece (fixed address in the pool). "split": an output of a splitting piece (may move).
    """
    call = next(n for n in split_gm.graph.nodes if n.op == "call_module" and n.target == submod_name)
    kinds = []
    for arg in call.args:
        node = arg
        while isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is operator.getitem:
            node = node.args[0]
        if not isinstance(node, torch.fx.Node):
            kinds.append("constant")
        elif node.op == "placeholder":
            value = example_value(node)
            kinds.append("param" if isinstance(value, torch.nn.Parameter) else "input")
        elif node.op == "call_module":
            kinds.append("split" if node.target in splitting_names else "piece")
        else:
            kinds.append("split")
    return kinds
