"""Splitting a Dynamo graph at splitting ops.

Rules (the behaviour engine authors know from vLLM):
- nodes keep their original order (`keep_original_order=True`): in-place mutations have no data edges, so
  reordering them would change results;
- each splitting op gets a piece of its own; consecutive splitting ops share one;
- a `getitem` stays with the node it unpacks, so a splitting op with several outputs never makes a cycle;
- `x.size()` is decomposed into one `sym_size` per dimension first, because a `torch.Size` cannot cross a piece
  boundary;
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
from collections.abc import Sequence

import torch
import torch.fx

from ._compat import example_value, op_identity, registered_ops, split_module, unbacked_symbols
from .config import ConfigError
from .piece import Piece, analyse

__all__ = ["split_graph", "op_names", "is_splitting_op", "check_splitting_ops", "absent_splitting_ops",
           "assign_pieces", "batch_symbols"]


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


def _unknown_op(name: str) -> str | None:
    """Why `name` ("ns::op" or "ns::op.overload") names no registered op, or None when it does."""
    namespace, _, rest = name.partition("::")
    op, _, overload = rest.partition(".")
    packet = getattr(getattr(torch.ops, namespace), op, None)
    if packet is not None and op_identity(packet) is not None and op_identity(packet)[1] is None:
        if overload and overload not in packet.overloads():
            return f"op {namespace}::{op} has no overload {overload!r}, only {sorted(packet.overloads())}"
        return None
    registered = sorted({n.split(".", 1)[0] for n in registered_ops()})
    ours = [r for r in registered if r.startswith(f"{namespace}::")]
    if not ours:
        close = difflib.get_close_matches(namespace, sorted({r.split("::", 1)[0] for r in registered}), n=3)
        return f"{name!r} names no registered op: no op is registered in namespace {namespace!r}" + (
            f" (close namespaces: {', '.join(close)})" if close else "")
    listed = difflib.get_close_matches(f"{namespace}::{op}", ours, n=len(ours), cutoff=0.6)
    listed += [r for r in ours if r not in listed]
    more = f" and {len(listed) - 12} more" if len(listed) > 12 else ""
    return (f"{name!r} names no registered op; namespace {namespace!r} has (closest first) "
            f"{', '.join(listed[:12])}{more}")


def check_splitting_ops(splitting_ops: Sequence[str]) -> None:
    """Raise `ConfigError` for an entry of `splitting_ops` that names no registered op (or overload).

    Checked when a graph is compiled, not when the config is built: by then the model has run its imports, so
    every op it calls is registered, while a config may well be built before the module that registers its ops.
    """
    for name in splitting_ops:
        problem = _unknown_op(name)
        if problem is not None:
            raise ConfigError(
                f"CompilationConfig.splitting_ops={list(splitting_ops)!r}: {problem}. Fix: "
                f"correct the name, or import the module that registers the op before the model's first call."
            )


def absent_splitting_ops(gm: torch.fx.GraphModule, splitting_ops: Sequence[str]) -> list[str]:
    """The entries of `splitting_ops` that match no node of `gm`, in their order."""
    seen = set()
    for node in gm.graph.nodes:
        if node.op == "call_function":
            seen |= op_names(node.target)
    return [name for name in splitting_ops if name not in seen]


def is_splitting_op(node: torch.fx.Node, splitting_ops: set[str]) -> bool:
    return node.op == "call_function" and bool(op_names(node.target) & splitting_ops)


def binds_unbacked_size(node: torch.fx.Node) -> bool:
    """Whether `node` is a `sym_size` whose value is a data-dependent (unbacked) symbol, as Dynamo emits right
    after `nonzero`, or after a custom op whose fake impl calls `new_dynamic_size()`."""
    if not (node.op == "call_function" and node.target is torch.ops.aten.sym_size.int):
        return False
    value = example_value(node)
    return isinstance(value, torch.SymInt) and bool(unbacked_symbols(value))


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


def assign_pieces(gm: torch.fx.GraphModule, splitting_ops: set[str]) -> tuple[dict, set[int]]:
    """Which piece each node goes to (see the module doc), and which pieces are splitting ones."""
    piece_of: dict[torch.fx.Node, int] = {}
    splitting_pieces: set[int] = set()
    current, previous = 0, False  # a new piece wherever the graph enters or leaves a run of splitting ops
    for node in gm.graph.nodes:
        if node.op in ("placeholder", "output"):
            continue
        unpacks = node.op == "call_function" and node.target is operator.getitem
        if (unpacks or binds_unbacked_size(node)) and node.args[0] in piece_of:
            piece_of[node] = piece_of[node.args[0]]
            continue
        splitting = is_splitting_op(node, splitting_ops)
        current += splitting != previous
        piece_of[node], previous = current, splitting
        if splitting:
            splitting_pieces.add(current)
    return piece_of, splitting_pieces


def _recompute_sizes_in_consumers(gm: torch.fx.GraphModule, piece_of: dict) -> None:
    """Give every piece that reads a `sym_size` of another piece its own copy, placed just before its first use.

    Then no compiled piece returns a SymInt of the batch, and node order (hence `keep_original_order`) is unchanged:
    the copy reads the tensor, which crosses the boundary as any tensor does. A data-dependent size is not copied:
    its first `sym_size` is where the symbol is bound, and it must come before every use.
    """
    graph = gm.graph
    for node in list(graph.nodes):
        if not (node.op == "call_function" and node.target is torch.ops.aten.sym_size.int):
            continue
        if binds_unbacked_size(node):
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


def batch_symbols(gm: torch.fx.GraphModule) -> frozenset[str]:
    """The symbols of the graph inputs' dim 0: the batch size (one symbol under `pieceworks.compile`)."""
    found = set()
    for node in gm.graph.nodes:
        value = example_value(node) if node.op == "placeholder" else None
        if isinstance(value, torch.Tensor) and value.dim() > 0 and isinstance(value.shape[0], torch.SymInt):
            found.add(str(value.shape[0]))
    return frozenset(found)


def split_graph(gm: torch.fx.GraphModule, splitting_ops: Sequence[str]) -> tuple[torch.fx.GraphModule, list[Piece]]:
    """Split `gm` at `splitting_ops`; return the stitching module and its pieces in run order, each analysed.

    `gm` is modified in place (sizes decomposed). The stitching module calls each piece exactly once, in the
    original order; its outputs equal `gm`'s on any input.
    """
    ops = set(splitting_ops)
    symbols = batch_symbols(gm)
    decompose_sizes(gm)
    piece_of, splitting_pieces = assign_pieces(gm, ops)
    _recompute_sizes_in_consumers(gm, piece_of)
    split_gm = split_module(gm, gm, lambda node: piece_of[node], keep_original_order=True)
    names = [n.target for n in split_gm.graph.nodes if n.op == "call_module"]
    splitting = {name for name in names if int(name.rsplit("_", 1)[1]) in splitting_pieces}
    return split_gm, [analyse(split_gm, name, graph_id, name in splitting, splitting, symbols)
                      for graph_id, name in enumerate(names)]
