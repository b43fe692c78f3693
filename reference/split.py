"""Splitting a Dynamo graph at splitting ops.

Rules (the behaviour engine authors know from vLLM):
- nodes keep their original order (`keep_original_order=True`): in-place mutations have no data edges, so
  reordering them would change results;
- each splitting op gets a piece of its own; consecutive splitting ops share one;
- a `getitem` stays with the node it unpacks, so a splitting op with several outputs never makes a cycle;
- `x.size()` is decomposed into one `sym_size` per dimension first, because a `torch.Size` cannot cross a
  piece boundary; a `sym_size`, and a scalar read from a graph input (`.item()`), is read again in each
  piece that uses it;
- a `sym_size` that binds a data-dependent (unbacked) size, e.g. of a splitting op's output made with
  `new_dynamic_size()`, stays with the node that made the tensor and crosses boundaries as an argument: the
  piece that reads the tensor reads the size from the piece that bound it (else `split_module` sees the size
  bound after its first use and reports a cycle);
- an empty `splitting_ops` gives one piece.

Each piece is then analysed once into its `Piece` record (piece.py).
"""

from __future__ import annotations

import difflib
import operator
from collections.abc import Collection, Sequence

import torch
from torch.fx import Graph, GraphModule, Node, map_arg

from ._compat import example_value, op_identity, registered_ops, split_module, unbacked_symbols
from .config import config_error
from .piece import Piece, analyse, traced_args

_SYM_SIZE = torch.ops.aten.sym_size.int


def op_names(target: object) -> set[str]:
    """The names a splitting-op entry can use for `target`: `"ns::op"` and `"ns::op.overload"`.

    Dynamo records custom ops as overload packets (`torch.ops.ns.op`), which match `"ns::op"` and
    `"ns::op.default"`; an `OpOverload` matches `"ns::op"` and its own overload name.
    """
    identity = op_identity(target)
    return set() if identity is None else {identity[0], f"{identity[0]}.{identity[1] or 'default'}"}


def _unknown_op(name: str) -> str | None:
    """Why `name` ("ns::op" or "ns::op.overload") names no registered op, or None when it does."""
    namespace, _, rest = name.partition("::")
    op, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, namespace), op, None)
    if packet is not None and (identity := op_identity(packet)) is not None and identity[1] is None:
        if overload and overload not in packet.overloads():
            return f"op {namespace}::{op} has no overload {overload!r}, only {sorted(packet.overloads())}"
        return None
    registered = sorted({n.split(".", 1)[0] for n in registered_ops()})
    ours = [r for r in registered if r.startswith(f"{namespace}::")]
    if not ours:
        close = difflib.get_close_matches(namespace, sorted({r.split("::", 1)[0] for r in registered}), n=3)
        hint = f" (close namespaces: {', '.join(close)})" if close else ""
        return f"{name!r} names no registered op: no op is registered in namespace {namespace!r}{hint}"
    listed = sorted(ours, key=lambda r: -difflib.SequenceMatcher(None, f"{namespace}::{op}", r).ratio())
    shown = ", ".join(listed[:12]) + (f" and {len(listed) - 12} more" if len(listed) > 12 else "")
    return f"{name!r} names no registered op; namespace {namespace!r} has (closest first) {shown}"


def check_splitting_ops(splitting_ops: Sequence[str]) -> None:
    """Raise `ConfigError` for an entry of `splitting_ops` that names no registered op (or overload).

    Checked when a graph is compiled, not when the config is built: by then the model has run its imports, so
    every op it calls is registered, while a config may well be built before the module that registers its
    ops.
    """
    if problems := [problem for problem in map(_unknown_op, splitting_ops) if problem is not None]:
        fix = "correct the name, or import the module that registers the op before the model's first call"
        raise config_error("splitting_ops", list(splitting_ops), problems[0], fix)


def absent_splitting_ops(gm: GraphModule, splitting_ops: Sequence[str]) -> list[str]:
    """The entries of `splitting_ops` that match no node of `gm`, in their order."""
    seen = {name for node in gm.graph.nodes if node.op == "call_function" for name in op_names(node.target)}
    return [name for name in splitting_ops if name not in seen]


def is_splitting_op(node: Node, splitting_ops: Collection[str]) -> bool:
    return node.op == "call_function" and not op_names(node.target).isdisjoint(splitting_ops)


def binds_unbacked_size(node: Node) -> bool:
    """Whether `node` is a `sym_size` whose value is a data-dependent (unbacked) symbol, as Dynamo emits right
    after `nonzero`, or after a custom op whose fake impl calls `new_dynamic_size()`."""
    return node.target is _SYM_SIZE and bool(unbacked_symbols(example_value(node)))


def decompose_sizes(graph: Graph) -> None:
    """Replace every `x.size()` (no dim) by one `sym_size.int(x, d)` per dimension, in place."""
    for node in graph.find_nodes(op="call_method", target="size"):
        if len(node.args) != 1 or node.kwargs or (value := example_value(node.args[0])) is None:
            continue
        with graph.inserting_before(node.next):
            dims = [graph.call_function(_SYM_SIZE, (node.args[0], d)) for d in range(value.dim())]
        for dim, size in zip(dims, value.shape):
            dim.meta["example_value"] = size
        for user in list(node.users):
            if user.target is operator.getitem and isinstance(user.args[1], int):
                user.replace_all_uses_with(dims[user.args[1]])
                graph.erase_node(user)
            else:
                # map_arg calls the lambda at once: the loop's variables are still this iteration's
                inputs = (user.args, user.kwargs)
                user.args, user.kwargs = map_arg(inputs, lambda a: dims if a is node else a)  # noqa: B023
        graph.erase_node(node)
    graph.lint()


def assign_pieces(gm: GraphModule, splitting_ops: set[str]) -> tuple[dict, set[int]]:
    """Which piece each node goes to (see the module doc), and which pieces are splitting ones."""
    piece_of: dict[Node, int] = {}
    # A new piece wherever the graph enters or leaves a run of splitting ops: piece 0 (maybe empty) is not a
    # splitting one, so the splitting pieces are the odd ones.
    current, previous = 0, False
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if (node.target is operator.getitem or binds_unbacked_size(node)) and node.args[0] in piece_of:
            piece_of[node] = piece_of[node.args[0]]
            continue
        splitting = is_splitting_op(node, splitting_ops)
        current += splitting != previous
        piece_of[node], previous = current, splitting
    return piece_of, {piece for piece in piece_of.values() if piece % 2}


def _recompute_scalars_in_consumers(graph: Graph, piece_of: dict) -> None:
    """Give every piece that reads a `sym_size` of another piece, or a scalar another piece read from a graph
    input (`x.item()`: Dynamo passes a Python float it saw change as a 0-d tensor), its own copy, placed just
    before its first use.

    Then no compiled piece returns a SymInt or a SymFloat (Inductor cannot), and node order (hence
    `keep_original_order`) is unchanged: the copy reads the tensor, which crosses the boundary as any tensor
    does. A data-dependent size is not copied: its first `sym_size` is where the symbol is bound, and it must
    come before every use.
    """
    order = {n: i for i, n in enumerate(graph.nodes)}  # the copies made below are never users of a `sym_size`
    sizes = [n for n in graph.find_nodes(op="call_function", target=_SYM_SIZE) if not binds_unbacked_size(n)]
    for node in sizes + [n for n in graph.find_nodes(op="call_method", target="item") if input_scalar(n)]:
        copies: dict[int, Node] = {}  # piece -> its copy, made before the piece's first user
        for user in sorted(node.users, key=order.__getitem__):
            piece = piece_of.get(user, piece_of[node])  # the output node is in no piece
            if piece != piece_of[node] and piece not in copies:
                with graph.inserting_before(user):
                    copy = copies[piece] = graph.node_copy(node)
                piece_of[copy] = piece
            if piece in copies:
                user.replace_input_with(node, copies[piece])
        if not node.users:  # its entry in `piece_of` stays, unread: `split_module` asks only about live nodes
            graph.erase_node(node)


def input_scalar(node: Node) -> bool:
    """Whether `node` reads the Python float Dynamo passes as a graph input (`x.item()` of a 0-d floating
    placeholder that nothing else uses, so nothing writes it between two reads)."""
    source = node.args[0]
    if not isinstance(source, Node) or source.op != "placeholder" or (value := example_value(source)) is None:
        return False
    return value.dim() == 0 and value.is_floating_point() and all(u.target == "item" for u in source.users)


def batch_symbols(gm: GraphModule) -> frozenset[str]:
    """The symbols of the graph inputs' dim 0: the batch size (one symbol under `pieceworks.compile`)."""
    firsts = [v.shape[0] for v in traced_args(gm) if isinstance(v, torch.Tensor) and v.dim() > 0]
    return frozenset(str(size) for size in firsts if isinstance(size, torch.SymInt))


def split_graph(gm: GraphModule, splitting_ops: Sequence[str]) -> tuple[GraphModule, list[Piece]]:
    """Split `gm` at `splitting_ops`; return the stitching module and its pieces in run order, each analysed.

    `gm` is modified in place (sizes decomposed, its code recompiled). The stitching module calls each piece
    exactly once, in the original order; its outputs equal `gm`'s on any input.
    """
    symbols = batch_symbols(gm)
    decompose_sizes(gm.graph)
    piece_of, splitting_pieces = assign_pieces(gm, set(splitting_ops))
    _recompute_scalars_in_consumers(gm.graph, piece_of)
    gm.recompile()
    split_gm = split_module(gm, lambda node: piece_of[node], keep_original_order=True)
    names = [n.target for n in split_gm.graph.nodes if n.op == "call_module"]
    splitting = {name for name in names if int(name.rsplit("_", 1)[1]) in splitting_pieces}
    return split_gm, [analyse(split_gm, name, i, splitting, symbols) for i, name in enumerate(names)]
