"""The PIECEWISE replay plan of one captured size: a fixed sequence of graph replays and eager steps.

`record_plan` runs the stitching module once, node by node in its order, on the arguments of one padded batch size:
each capturable compiled piece is captured (`capture(fn, args, mutated)`), everything else (splitting ops, pieces that
cannot be captured, glue such as `getitem`) runs eagerly. It records, for every node, where a replay finds its value:
- a constant: what a graph wrote (a non-owning alias of the capture's output, at a fixed pool address), or a
  `getitem` of one (folded at record time, so it costs nothing per call);
- a graph input: `args[i]` of the call;
- a slot: the output of an eager step, fresh on every call.

`ReplayPlan.run(args, checks)` then loops over prepared steps: no Dynamo frame, no FX module call, no per-piece batch
lookup or compile-target dispatch (the runnable of this size is resolved at record time). Addresses:
- graph inputs: a graph reads the address it captured. When the caller guarantees them (static buffers,
  `checks=()`), nothing is checked; otherwise `check_addresses` runs once per call over the inputs the graphs read
  (`cheap_checks`: caller-owned inputs; `all_checks`: parameters and buffers too, for `debug_replay_checks`);
- eager outputs a graph reads (a splitting op that returns a fresh tensor): compared per replay with the tensor the
  graph captured, which the plan keeps alive, and **copied into it** when it moved (one device copy; splitting ops
  that write into a buffer the piece before allocated, as attention does, cost nothing).
"""

from __future__ import annotations

import collections
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from .cudagraph import AddressCheck, check_addresses, non_owning_alias
from .values import tree_map

__all__ = ["ReplayPlan", "GraphPiece", "record_plan"]

Step = Callable[[Sequence[Any], list], None]
_CONST, _INPUT, _SLOT = 0, 1, 2
# Where a replay finds a value: (_CONST, value), (_INPUT, index into args) or (_SLOT, index into slots). Its own type,
# so that `tree_map` treats it as a leaf.
_Ref = collections.namedtuple("_Ref", ["kind", "where"])


class GraphPiece:
    """What `record_plan` needs to capture one compiled piece: its per-batch runnable, the positions of the inputs
    it writes to in place, its placeholder names and a label for errors."""

    def __init__(self, runnable_for: Callable[[Sequence[Any]], Callable[..., Any]], mutated: Sequence[int],
                 names: Sequence[str], label: str) -> None:
        self.runnable_for = runnable_for
        self.mutated = list(mutated)
        self.names = list(names)
        self.label = label


class ReplayPlan:
    """A recorded PIECEWISE forward pass of one batch size. `run(args, checks)` replays it; see the module doc."""

    def __init__(self, batch: int, steps: list[Step], num_slots: int, output: Any, cheap_checks: list[AddressCheck],
                 all_checks: list[AddressCheck], graphs: list[Any], eager_steps: list[int],
                 keep: list[torch.Tensor], step_names: list[str], graph_outputs: list[Any]) -> None:
        self.batch = batch
        self.steps = steps
        self.num_slots = num_slots
        self.output = output  # a ref tree (see _resolve), or the constant outputs themselves when `output_is_constant`
        self.output_is_constant = _is_constant(output)
        if self.output_is_constant:
            self.output = _value(output, (), [])
        self.cheap_checks = cheap_checks
        self.all_checks = all_checks
        self.graphs = graphs  # the CUDA graphs, in replay order
        self.eager_steps = eager_steps  # indices of `steps` that run eagerly (splitting ops, glue, uncapturable)
        self.step_names = step_names  # per step: the stitching-module node's target (a piece's name for pieces)
        self.graph_outputs = graph_outputs  # per graph: the (non-owning) outputs a replay writes
        self.keep = keep  # capture-time eager outputs the graphs read: owned here so their addresses stay valid

    def run(self, args: Sequence[Any], checks: Sequence[AddressCheck]) -> Any:
        if checks:
            check_addresses(args, checks, self.batch)
        slots = [None] * self.num_slots
        for step in self.steps:
            step(args, slots)
        if self.output_is_constant:
            return self.output
        return _value(self.output, args, slots)


def _is_constant(ref_tree: Any) -> bool:
    found = []
    tree_map(lambda r: found.append(r.kind != _CONST), ref_tree)
    return not any(found)


def _value(ref_tree: Any, args: Sequence[Any], slots: list) -> Any:
    def one(ref: _Ref) -> Any:
        kind, where = ref
        return where if kind == _CONST else (args[where] if kind == _INPUT else slots[where])

    return tree_map(one, ref_tree)


def _ref_tree(arg: Any, refs: dict[torch.fx.Node, _Ref]) -> Any:
    """The ref tree of an FX argument: nodes become their refs, literals become constants."""
    return tree_map(lambda a: refs[a] if isinstance(a, torch.fx.Node) else _Ref(_CONST, a), arg)


def _getter(ref_tree: Any) -> Callable[[Sequence[Any], list], Any]:
    if _is_constant(ref_tree):
        value = _value(ref_tree, (), [])
        return lambda args, slots: value
    if isinstance(ref_tree, _Ref) and ref_tree.kind == _INPUT:
        i = ref_tree.where
        return lambda args, slots: args[i]
    if isinstance(ref_tree, _Ref) and ref_tree.kind == _SLOT:
        j = ref_tree.where
        return lambda args, slots: slots[j]
    return lambda args, slots: _value(ref_tree, args, slots)


def _eager_step(fn: Callable[..., Any], arg_refs: list, kwarg_refs: dict, slot: int) -> Step:
    getters = [_getter(r) for r in arg_refs]
    kw_getters = {k: _getter(r) for k, r in kwarg_refs.items()}
    if all(_is_constant(r) for r in arg_refs) and not kw_getters:
        constant_args = [_value(r, (), []) for r in arg_refs]

        def run_constant(args: Sequence[Any], slots: list) -> None:
            slots[slot] = fn(*constant_args)

        return run_constant

    def run(args: Sequence[Any], slots: list) -> None:
        slots[slot] = fn(*[g(args, slots) for g in getters], **{k: g(args, slots) for k, g in kw_getters.items()})

    return run


def _replay_step(replay: Callable[[], None], moved: list[tuple[int, torch.Tensor]]) -> Step:
    if not moved:
        return lambda args, slots: replay()

    def run(args: Sequence[Any], slots: list) -> None:
        for j, captured in moved:
            fresh = slots[j]
            if fresh.data_ptr() != captured.data_ptr():
                captured.copy_(fresh)
        replay()

    return run


def _single_op(gm: torch.fx.GraphModule, used: bool) -> tuple[Callable[..., Any], list[int]] | None:
    """`(op, positions)` when a splitting piece is one op on some of its inputs (attention is): the plan calls
    `op(*[inputs[p] for p in positions])` directly, without the piece's FX frame. None otherwise."""
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(nodes) != 1 or nodes[0].op != "call_function" or nodes[0].kwargs:
        return None
    if not all(isinstance(a, torch.fx.Node) and a.op == "placeholder" for a in nodes[0].args):
        return None
    output = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    if used and output is not nodes[0]:
        return None
    return nodes[0].target, [placeholders.index(a) for a in nodes[0].args]


def _callable(split_gm: torch.fx.GraphModule, node: torch.fx.Node) -> Callable[..., Any]:
    if node.op == "call_module":
        module = getattr(split_gm, node.target)
        return module.forward if isinstance(module, torch.fx.GraphModule) else module
    if node.op == "call_method":
        return lambda self_, *rest, **kw: getattr(self_, node.target)(*rest, **kw)
    return node.target


def record_plan(
    split_gm: torch.fx.GraphModule, batch: int, args: Sequence[Any], graph_pieces: dict[str, GraphPiece],
    capture: Callable[[Callable[..., Any], Sequence[Any], Sequence[int]], tuple[Any, Any]],
) -> tuple[ReplayPlan, Any]:
    """Run `split_gm(*args)` once, capturing the pieces named in `graph_pieces`; return the plan and this run's
    (owning) outputs. `capture(fn, args, mutated)` returns `(graph, outputs)` with the outputs already computed."""
    real: dict[torch.fx.Node, Any] = {}
    refs: dict[torch.fx.Node, _Ref] = {}
    steps: list[Step] = []
    cheap: dict[int, AddressCheck] = {}
    every: dict[int, AddressCheck] = {}
    graphs, keep, eager, names, graph_outputs = [], [], [], [], []
    num_slots = 0
    placeholder = 0
    outputs = output_refs = None
    # Drop this run's values after their last use, as the stitching module's own code does, so that later pieces'
    # captures can reuse the pool blocks of values that are dead by then.
    last_use = {inp: node for node in split_gm.graph.nodes for inp in node.all_input_nodes}
    previous = None
    for node in split_gm.graph.nodes:
        if previous is not None:
            for inp in previous.all_input_nodes:
                if last_use[inp] is previous and previous.op != "output":
                    real.pop(inp, None)
        previous = node
        if node.op == "placeholder":
            real[node], refs[node] = args[placeholder], _Ref(_INPUT, placeholder)
            placeholder += 1
            continue
        if node.op == "output":
            outputs = torch.fx.node.map_arg(node.args[0], real.__getitem__)
            output_refs = _ref_tree(node.args[0], refs)
            continue
        if node.op == "get_attr":
            value = split_gm
            for part in node.target.split("."):
                value = getattr(value, part)
            real[node], refs[node] = value, _Ref(_CONST, value)
            continue
        call_args = torch.fx.node.map_arg(node.args, real.__getitem__)
        call_kwargs = torch.fx.node.map_arg(node.kwargs, real.__getitem__)
        arg_refs = [_ref_tree(a, refs) for a in node.args]
        kwarg_refs = {k: _ref_tree(v, refs) for k, v in node.kwargs.items()}
        piece = graph_pieces.get(node.target) if node.op == "call_module" else None
        if piece is not None:
            graph, out = capture(piece.runnable_for(call_args), call_args, piece.mutated)
            moved = []
            for position, (value, ref) in enumerate(zip(call_args, arg_refs)):
                if not isinstance(value, torch.Tensor):
                    continue
                if not isinstance(ref, _Ref):
                    continue
                if ref.kind == _INPUT:
                    check = (ref.where, value.data_ptr(), piece.label, position, piece.names[position])
                    every.setdefault(ref.where, check)
                    if not isinstance(value, torch.nn.Parameter):
                        cheap.setdefault(ref.where, check)
                elif ref.kind == _SLOT:
                    moved.append((ref.where, value))
                    keep.append(value)
            steps.append(_replay_step(graph.replay, moved))
            names.append(str(node.target))
            graphs.append(graph)
            real[node], refs[node] = out, _Ref(_CONST, tree_map(non_owning_alias, out))
            graph_outputs.append(refs[node].where)
            continue
        if node.op == "call_function" and node.target is operator.getitem and _is_constant(arg_refs[0]):
            real[node] = operator.getitem(*call_args)
            refs[node] = _Ref(_CONST, _value(arg_refs[0], (), [])[node.args[1]])
            continue
        fn = _callable(split_gm, node)
        module = getattr(split_gm, node.target) if node.op == "call_module" else None
        op = _single_op(module, bool(node.users)) if isinstance(module, torch.fx.GraphModule) else None
        if op is not None:
            fn, positions = op
            call_args = tuple(call_args[p] for p in positions)
            arg_refs = [arg_refs[p] for p in positions]
        real[node] = fn(*call_args, **call_kwargs)
        refs[node] = _Ref(_SLOT, num_slots)
        eager.append(len(steps))
        names.append(str(node.target))
        steps.append(_eager_step(fn, arg_refs, kwarg_refs, num_slots))
        num_slots += 1
    plan = ReplayPlan(batch, steps, num_slots, output_refs, list(cheap.values()), list(every.values()), graphs, eager,
                      keep, names, graph_outputs)
    return plan, outputs
