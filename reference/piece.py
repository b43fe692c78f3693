"""A piece of a split graph and the facts about it, found once, right after the split.

`Piece` is the one record of a piece from the split to the replay. `analyse` builds it from the stitching
module: which inputs the piece writes in place, its data-dependent (unbacked) sizes, why it cannot be captured
in a CUDA graph, where its batch size sits in its arguments, and its fingerprint. Everything later (the
compiler, the runtime, the replay plans, tools) reads these fields; nothing computes them again. The compiler
returns a copy with `runnables` filled (`dataclasses.replace`); a record is never changed in place.

Capturability follows PyTorch's dynamo `cudagraphs` backend: a piece is refused (it then runs eagerly between
graphs, logged once with the reason) when it makes CPU tensors (0-d scalars aside), has tensors on several
devices, synchronises with the host (`.item()`, `nonzero`, ...), has data-dependent sizes, or writes in place
to an input whose address is not fixed (an output of a splitting op, allocated anew on every call: PIECEWISE
only, `Piece.piecewise_refusal`).

Compile dispatch (`compile_target`): a batch size runs the code of its compile size if there is one, else that
of the compile range holding it, else `BatchSizeError` names the batch and the ranges; O(log n) with `bisect`,
memoised per batch size by `Piece.runnable`.
"""

from __future__ import annotations

import bisect
import dataclasses
import operator
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple, cast

import torch.fx

from ._compat import example_value, op_identity, op_schema, symbol_name, unbacked_symbols
from .key import graph_fingerprint
from .values import tensors_in

Range = tuple[int, int]  # a closed compile range (lo, hi)
Target = int | Range  # a compile size, or a compile range

# methods and ops that wait for the host
_SYNC_OPS = frozenset(
    "item tolist cpu numpy _local_scalar_dense nonzero masked_select unique _unique2 unique_consecutive "
    "repeat_interleave bincount histc".split()
)
# `x += y` and the like, and `x[i] = y`
_INPLACE_OPERATORS = {
    getattr(operator, n) for n in "setitem iadd isub imul itruediv ifloordiv imod ipow iand ior ixor".split()
}
_VIEWS = frozenset(
    "view reshape transpose permute expand narrow select unsqueeze squeeze flatten unflatten split chunk t "
    "as_strided view_as unbind diagonal".split()
)


class BatchSizeError(ValueError):
    """A batch size that no compiled code covers."""


def find_range(ranges: Sequence[Range], batch: int) -> Range | None:
    """The closed range `(lo, hi)` of sorted, disjoint `ranges` that holds `batch`, or None."""
    i = bisect.bisect_left([hi for _, hi in ranges], batch)
    return ranges[i] if i < len(ranges) and ranges[i][0] <= batch <= ranges[i][1] else None


def compile_target(compile_sizes: Sequence[int], ranges: Sequence[Range], batch: int) -> Target:
    """The compile size equal to `batch`, else the range holding it; raises `BatchSizeError` otherwise."""
    found = batch if batch in compile_sizes else find_range(ranges, batch)
    if found is None:
        where = f"batch size {batch} is outside every compile range {list(ranges)}"
        limit = "CompilationConfig.max_num_batched_tokens (or the last compile_ranges endpoint)"
        raise BatchSizeError(f"{where}; raise {limit} to serve it")
    return found


class BatchPosition(NamedTuple):
    """Where the batch size sits in positional arguments: `args[index]` itself (`dim` None: a SymInt
    argument), or `args[index].shape[dim]`."""

    index: int  # type: ignore[assignment]  # a field may shadow tuple.index; mypy rejects the override
    dim: int | None

    def read(self, args: Sequence[Any]) -> int:
        return int(args[self.index]) if self.dim is None else args[self.index].shape[self.dim]


def batch_position(args: Sequence[Any], batch_symbols: frozenset[str]) -> BatchPosition | None:
    """The first SymInt argument that is a batch symbol, else the first tensor dimension that is exactly
    one; None when the arguments do not depend on the batch size."""
    tensors = [(i, v) for i, v in enumerate(args) if isinstance(v, torch.Tensor)]
    sizes = [(BatchPosition(i, None), v) for i, v in enumerate(args)]
    sizes += [(BatchPosition(i, d), n) for i, t in tensors for d, n in enumerate(t.shape)]
    return next((where for where, n in sizes if symbol_name(n) in batch_symbols), None)


@dataclasses.dataclass(frozen=True, eq=False)
class Piece:
    """One piece of a split FX graph: `stitching_module.<submod_name>`, the `graph_id`-th in run order (vLLM's
    names).

    `example_args`: the FakeTensors/SymInts it received in Dynamo's trace. `runnables`: compiled code per
    compile target (empty for splitting pieces, which run as traced). A compiled piece is installed in the
    stitching module in place of its submodule; calling it finds the batch size and calls the code compiled
    for it (one dict lookup per call once a size has been seen; the lookup table is only ever added to).
    """

    submod_name: str
    graph_id: int
    is_splitting_graph: bool
    fx_graph: torch.fx.GraphModule
    example_args: tuple = ()
    mutated_inputs: tuple[int, ...] = ()
    unbacked_symbols: tuple[str, ...] = ()
    uncapturable: str | None = None
    moving_inputs: tuple[int, ...] = ()
    batch_position: BatchPosition | None = None
    fingerprint: str = ""
    runnables: Mapping[Target, Callable[..., Any]] = dataclasses.field(default_factory=dict)
    _by_batch: dict[int | None, Callable[..., Any]] = dataclasses.field(default_factory=dict, init=False)

    @property
    def piecewise_refusal(self) -> str | None:
        """Why this piece cannot have a CUDA graph of its own: `uncapturable`, or it writes in place to an
        input a splitting op allocates anew on every call (a replay would write to a stale address). None
        if it can."""
        stale = sorted(set(self.mutated_inputs) & set(self.moving_inputs))
        if self.uncapturable is not None or not stale:
            return self.uncapturable
        why = f"it mutates input {stale[0]} ({self.placeholder_names[stale[0]]}), which a splitting op "
        return why + "allocates anew on every call: a replay would write to a stale address"

    @property
    def placeholder_names(self) -> list[str]:
        return [n.name for n in self.fx_graph.graph.nodes if n.op == "placeholder"]

    def runnable(self, batch: int | None) -> Callable[..., Any]:
        """The code compiled for `batch`: its compile size, else its compile range (`BatchSizeError`
        outside); the first range's for a piece that does not depend on the batch (`batch` None)."""
        if (fn := self._by_batch.get(batch)) is None:
            ranges = sorted(t for t in self.runnables if isinstance(t, tuple))
            sizes = [t for t in self.runnables if isinstance(t, int)]
            target = ranges[0] if batch is None else compile_target(sizes, ranges, batch)
            fn = self._by_batch[batch] = self.runnables[target]
        return fn

    def runnable_for(self, args: Sequence[Any]) -> Callable[..., Any]:
        return self.runnable(None if self.batch_position is None else self.batch_position.read(args))

    def __call__(self, *args: Any) -> Any:
        return self.runnable_for(args)(*args)

    def __repr__(self) -> str:
        return f"Piece({self.submod_name}, graph_id={self.graph_id}, targets={list(self.runnables)})"


def analyse(
    split_gm: torch.fx.GraphModule, name: str, graph_id: int, splitting: set[str], symbols: frozenset[str]
) -> Piece:
    """The facts of piece `name` of `split_gm`, the `graph_id`-th in run order; `splitting`: the names of the
    splitting pieces, `symbols`: the batch size's symbols (see the module doc)."""
    gm = getattr(split_gm, name)
    args, is_splitting = traced_args(gm), name in splitting
    moving = () if is_splitting else tuple(sorted(moving_inputs(split_gm, name, splitting)))
    why = uncapturable_reason(gm, args)
    # A splitting op on CPU values is no reason against FULL.
    why = None if is_splitting and why == "no CUDA tensors" else why
    mutated, unbacked = tuple(sorted(mutated_inputs(gm))), tuple(data_dependent_sizes(gm))
    # where the batch size sits, and what the piece computes
    where, fingerprint = batch_position(args, symbols), graph_fingerprint(gm, list(args))
    drop_unread_values(gm)
    return Piece(name, graph_id, is_splitting, gm, args, mutated, unbacked, why, moving, where, fingerprint)


def drop_unread_values(gm: torch.fx.GraphModule) -> None:
    """Drop the trace values (`meta["example_value"]`) of `gm`'s nodes that nothing reads once `analyse` has
    read them. A piece keeps its placeholders' (its cache entry's claim, its compile's example args), those
    it returns (`compile_inductor` takes the shape environment from them) and each method call's receiver's
    (AOTAutograd's cache stores no artifact for a method called on a value not known to be a tensor). The
    serving record pickles the split, and a warm start rebuilds every FakeTensor kept: those inside a piece
    were about half of them (a Llama model's)."""
    read = {*gm.graph.find_nodes(op="placeholder"), *gm.graph.output_node().all_input_nodes}
    for node in set(gm.graph.nodes) - read - {n.args[0] for n in gm.graph.find_nodes(op="call_method")}:
        node.meta.pop("example_value", None)


def traced_args(graph: torch.fx.GraphModule) -> tuple:
    """The FakeTensors/SymInts a piece received in Dynamo's trace: its placeholders' example values, which
    `split_module` copies from the traced nodes. Read, never recomputed: re-running a piece under the
    trace's fake mode would mint a fresh unbacked symbol for every data-dependent size and leave it pending
    in the shared shape environment, where the next compile fails with `PendingUnbackedSymbolNotFound`."""
    return tuple(example_value(n) for n in graph.graph.nodes if n.op == "placeholder")


def _op_name(node: torch.fx.Node) -> str:
    """A node's bare op name (`nonzero` for `aten::nonzero.default`), else its function's `__name__`, else
    its target (a `call_method` node's method name)."""
    identity = op_identity(node.target)
    return identity[0].split("::")[-1] if identity else getattr(node.target, "__name__", str(node.target))


def _written_args(node: torch.fx.Node) -> list[Any]:
    """The arguments `node` writes in place (empty for a node that writes nothing). Only a `call_function`
    node has a callable target; the others' targets are strings, which are neither operators nor ops and
    have no `__name__`."""
    if node.target in _INPLACE_OPERATORS:
        return [node.args[0]]
    if node.op == "call_function" and "out" in node.kwargs:
        return tensors_in(node.kwargs["out"], torch.fx.Node)
    if (schema := op_schema(node.target)) is not None:
        args = [*node.args, *(node.kwargs.get(a.name) for a in schema.arguments[len(node.args) :])]
        return [arg for arg, a in zip(args, schema.arguments) if getattr(a.alias_info, "is_write", False)]
    name = cast(str, node.target) if node.op == "call_method" else getattr(node.target, "__name__", "")
    return [node.args[0]] if node.args and name.endswith("_") and not name.endswith("__") else []


def _source(node: Any, methods: Collection[str] = ()) -> Any:
    """The value `node` unpacks (following getitem) or is a view of (following the methods named in
    `methods`, e.g. `_VIEWS`)."""
    while isinstance(node, torch.fx.Node) and (
        node.target is operator.getitem or (node.op == "call_method" and node.target in methods)
    ):
        node = node.args[0]
    return node


def mutated_inputs(gm: torch.fx.GraphModule, skip: Callable[..., bool] = lambda node: False) -> set[int]:
    """Indices of `gm`'s placeholders that some node (but those `skip` names) writes to in place (directly
    or through a view)."""
    placeholders = {node: i for i, node in enumerate(gm.graph.find_nodes(op="placeholder"))}
    bases = {_source(a, _VIEWS) for node in gm.graph.nodes if not skip(node) for a in _written_args(node)}
    return {placeholders[base] for base in bases if base in placeholders}


def data_dependent_sizes(gm: torch.fx.GraphModule) -> list[str]:
    """The data-dependent (unbacked) symbols in `gm`'s traced values, e.g. `u0` from `.item()`, `nonzero`
    or a splitting op whose fake impl calls `new_dynamic_size()`; sorted. A CUDA graph or a static compile
    would bake in the value one call saw."""
    holders = (torch.Tensor, torch.SymInt, torch.SymFloat)  # the values a symbol can be in
    values = [value for node in gm.graph.nodes for value in tensors_in(example_value(node), holders)]
    return sorted({symbol for value in values for symbol in unbacked_symbols(value)})


def uncapturable_reason(gm: torch.fx.GraphModule, example_args: Sequence[Any]) -> str | None:
    """Why `gm` cannot be captured in a CUDA graph, naming the node; None if it can. `example_args` are the
    values of `gm`'s placeholders (`traced_args`), so a CPU tensor input is reported as the placeholder
    that makes it."""
    devices = {t.device for a in example_args for t in tensors_in(a)}
    for node in gm.graph.nodes:
        for t in tensors_in(example_value(node)):
            devices.add(t.device)
            if t.device.type == "cpu" and t.dim() > 0:
                return f"node {node.name} ({node.format_node()}) makes a CPU tensor"
        if node.op in ("call_method", "call_function") and _op_name(node) in _SYNC_OPS:
            return f"node {node.name} ({node.format_node()}) synchronises with the host"
    if symbols := data_dependent_sizes(gm):
        return f"its sizes depend on data ({', '.join(symbols)}), which a CUDA graph would bake in"
    if not (cuda := {d for d in devices if d.type == "cuda"}):
        return "no CUDA tensors"
    return f"tensors on several devices {sorted(map(str, cuda))}" if len(cuda) > 1 else None


def moving_inputs(split_gm: torch.fx.GraphModule, submod_name: str, splitting_names: set[str]) -> set[int]:
    """Positions of the arguments of the call to `submod_name` whose address may change between calls:
    outputs of splitting pieces and of glue in the stitching module (not graph inputs, constants or
    compiled pieces' outputs, which sit at fixed addresses)."""
    call = next(n for n in split_gm.graph.nodes if n.op == "call_module" and n.target == submod_name)
    sources = {position: _source(arg) for position, arg in enumerate(call.args)}
    made = {i: n for i, n in sources.items() if isinstance(n, torch.fx.Node) and n.op != "placeholder"}
    return {i for i, n in made.items() if n.op != "call_module" or n.target in splitting_names}
