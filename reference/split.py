"""Splitting a Dynamo graph at splitting ops.

Rules (the behaviour engine authors know from vLLM):
- nodes keep their original order (`keep_original_order=True`): in-place mutations have no data edges, so
  reordering them would change results;
- each splitting op gets a piece of its own; consecutive splitting ops share one;
- a `getitem` stays with the node it unpacks, so a splitting op with several outputs never makes a cycle;
- `x.size()` is decomposed into one `sym_size` per dimension first, because a `torch.Size` cannot cross a piece
  boundary;
- an empty `splitting_ops` gives one piece.
"""

from __future__ import annotations

import dataclasses
import operator

import torch
import torch.fx

from ._compat import example_value, op_identity, split_module

__all__ = ["SplitItem", "split_graph", "op_names", "is_splitting_op"]


@dataclasses.dataclass
class SplitItem:
    """One piece of a split graph: `split_gm.<submod_name>` is `graph`, the `graph_id`-th piece in run order."""

    submod_name: str
    graph_id: int
    is_splitting_graph: bool
    graph: torch.fx.GraphModule


def op_names(target: object) -> set[str]:
    """The names a splitting-op entry can use for `target`: `"ns::op"` and `"ns::op.overload"`.

    Dynamo records custom ops as overload packets (`torch.ops.ns.op`), which match `"ns::op"` and
    `"ns::op.default"`; an `OpOverload` matches `"ns::op"` and its own overload name.
    """
    identity = op_identity(target)
    if identity is None:
        return set()
    name, overload = identity
    return {name, f"{name}.{overload or 'default'}"}


def is_splitting_op(node: torch.fx.Node, splitting_ops: set[str]) -> bool:
    return node.op == "call_function" and bool(op_names(node.target) & splitting_ops)


def decompose_sizes(gm: torch.fx.GraphModule) -> None:
    """Replace every `x.size()` (no dim) by one `sym_size.int(x, d)` per dimension, in place."""
    graph = gm.graph
    for node in list(graph.nodes):
        if not (node.op == "call_method" and node.target == "size" and len(node.args) == 1 and not node.kwargs):
            continue
        tensor = node.args[0]
        value = example_value(tensor)
        if value is None:
            continue
        dims = []
        anchor = node
        for d in range(value.dim()):
            with graph.inserting_after(anchor):
                anchor = graph.call_function(torch.ops.aten.sym_size.int, (tensor, d))
            anchor.meta["example_value"] = value.shape[d]
            dims.append(anchor)
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem and isinstance(user.args[1], int):
                user.replace_all_uses_with(dims[user.args[1]])
                graph.erase_node(user)
            else:
                user.args = tuple(dims if a is node else a for a in user.args)
                user.kwargs = {k: (dims if v is node else v) for k, v in user.kwargs.items()}
        if not node.users:
            graph.erase_node(node)
    graph.lint()
    gm.recompile()


def _assign_pieces(gm: torch.fx.GraphModule, splitting_ops: set[str]) -> tuple[dict, set[int]]:
    piece_of: dict[torch.fx.Node, int] = {}
    splitting_pieces: set[int] = set()
    current = 0
    previous_was_split = False
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        if node.op == "call_function" and node.target is operator.getitem and node.args[0] in piece_of:
            piece_of[node] = piece_of[node.args[0]]
            continue
        if is_splitting_op(node, splitting_ops):
            if not previous_was_split:
                current += 1
            piece_of[node] = current
            splitting_pieces.add(current)
            previous_was_split = True
            continue
        if previous_was_split:
            current += 1
        previous_was_split = False
        piece_of[node] = current
    return piece_of, splitting_pieces


def _recompute_sizes_in_consumers(gm: torch.fx.GraphModule, piece_of: dict) -> None:
    """Give every piece that reads a `sym_size` of another piece its own copy, placed just before its first use.

    Then no compiled piece returns a SymInt, and node order (hence `keep_original_order`) is unchanged: the copy
    reads the tensor, which crosses the boundary as any tensor does.
    """
    graph = gm.graph
    for node in list(graph.nodes):
        if not (node.op == "call_function" and node.target is torch.ops.aten.sym_size.int):
            continue
        by_piece: dict[int, list[torch.fx.Node]] = {}
        for user in node.users:
            if user in piece_of and piece_of[user] != piece_of[node]:
                by_piece.setdefault(piece_of[user], []).append(user)
        order = {n: i for i, n in enumerate(graph.nodes)}
        for piece, users in by_piece.items():
            first = min(users, key=order.__getitem__)
            with graph.inserting_before(first):
                copy = graph.call_function(torch.ops.aten.sym_size.int, node.args)
            copy.meta = dict(node.meta)
            piece_of[copy] = piece
            for user in users:
                user.replace_input_with(node, copy)
        if not node.users:
            graph.erase_node(node)
            del piece_of[node]
    gm.recompile()


def split_graph(
    gm: torch.fx.GraphModule, splitting_ops: list[str] | set[str]
) -> tuple[torch.fx.GraphModule, list[SplitItem]]:
    """Split `gm` at `splitting_ops`; return the stitching module and its pieces in run order.

    `gm` is modified in place (sizes decomposed). The stitching module calls each piece exactly once, in the
    original order; its outputs equal `gm`'s on any input.
    """
    ops = set(splitting_ops)
    decompose_sizes(gm)
    piece_of, splitting_pieces = _assign_pieces(gm, ops)
    _recompute_sizes_in_consumers(gm, piece_of)
    split_gm = split_module(gm, gm, lambda node: piece_of[node], keep_original_order=True)

    items = []
    names = [n.target for n in split_gm.graph.nodes if n.op == "call_module"]
    for graph_id, name in enumerate(names):
        piece_index = int(name.rsplit("_", 1)[1])
        items.append(SplitItem(name, graph_id, piece_index in splitting_pieces, getattr(split_gm, name)))
    return split_gm, items
