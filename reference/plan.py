"""The PIECEWISE replay plan of one captured size: a fixed sequence of graph replays and eager steps.

`record_plan` runs the stitching module once, node by node in its order, on the arguments of one padded batch
size: each capturable compiled piece is captured (`capture(fn, args, mutated)`), everything else (splitting
ops, pieces that cannot be captured, glue such as `getitem`) runs eagerly. It records, for every node, where a
replay finds its value:
- a constant: what a graph wrote (a non-owning alias of the capture's output, at a fixed pool address), or a
  `getitem` of one (folded at record time, so it costs nothing per call);
- a graph input: `args[i]` of the call;
- a slot: the output of an eager step, fresh on every call.

`ReplayPlan.run(args, checks)` then loops over prepared steps: no Dynamo frame, no FX module call, no
per-piece batch lookup or compile-target dispatch (the runnable of this size is resolved at record time).
`FullReplay` is the FULL counterpart: one replay over the whole stitching module. Both are read-only once
made; tools read `padded_size`, `cuda_graphs` (in replay order), `steps` (`Step(name, how, run)`: how
"cuda_graph" or "eager"; `run(args, slots)` does one step into a list of `num_slots` slots, the k-th eager
step writing slot k, so that a tool can time steps one by one) and `cuda_graph_outputs`.
Addresses:
- graph inputs: a graph reads the address it captured. When the caller guarantees them (static buffers,
  `checks=()`), nothing is checked; otherwise `check_addresses` runs once per call over the inputs the graphs
  read (`cheap_checks`: caller-owned inputs; `all_checks`: parameters and buffers too, for
  `debug_replay_checks`);
- eager outputs a graph reads (a splitting op that returns a fresh tensor): compared per replay with the
  tensor the graph captured, which the plan keeps alive, and **copied into it** when it moved (one device
  copy; splitting ops that write into a buffer the piece before allocated, as attention does, cost nothing).
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, cast

import torch.fx

from .cudagraph import AddressCheck, check_addresses, non_owning_alias
from .piece import Piece
from .values import tensors_in, tree_map

StepFn = Callable[[Sequence[Any], list], None]


# Where a replay finds a value (`_Ref.where`): a constant, the call's arguments, or the plan's slots; plain
# ints, compared per replay.
_CONST, _INPUT, _SLOT = range(3)


class _Ref:
    """Where a replay finds a value: (_CONST, value), (_INPUT, index into args) or (_SLOT, index into
    slots). A plain class, so that `tree_map` treats it as a leaf."""

    __slots__ = ("where", "at")

    def __init__(self, where: int, at: Any) -> None:
        self.where, self.at = where, at


class Step(NamedTuple):
    """One step of a plan: `run(args, slots)` replays a graph (`how` "cuda_graph") or runs a node eagerly
    ("eager": splitting ops, pieces that cannot be captured, glue), writing its value into `slots`. `name`:
    the stitching module node's target (a piece's name for pieces)."""

    name: str
    how: str
    run: StepFn


@dataclasses.dataclass(eq=False, repr=False)
class ReplayPlan:
    """A recorded PIECEWISE forward pass of one batch size. `run(args, checks)` replays it; see the module
    doc. `output`: where a replay finds the outputs (refs, like the steps' arguments)."""

    padded_size: int
    steps: tuple[Step, ...]
    num_slots: int
    output: Any
    # caller-owned inputs the graphs read; and parameters and buffers
    cheap_checks: tuple[AddressCheck, ...]
    all_checks: tuple[AddressCheck, ...]
    # eager outputs the graphs read, owned here so that their addresses stay valid
    kept: tuple[torch.Tensor, ...]
    cuda_graph_outputs: tuple[Any, ...]  # per graph: the (non-owning) outputs a replay writes

    def __post_init__(self) -> None:
        self.cuda_graphs = tuple(cast(Any, s.run).cuda_graph for s in self.steps if s.how == "cuda_graph")
        self._runs = [s.run for s in self.steps]
        self._output = _getter(self.output)

    def run(self, args: Sequence[Any], checks: Sequence[AddressCheck] = ()) -> Any:
        if checks:
            check_addresses(args, checks, self.padded_size)
        slots = [None] * self.num_slots
        for run in self._runs:
            run(args, slots)
        return self._output(args, slots)


class FullReplay(ReplayPlan):
    """The FULL CUDA graph of one padded size, captured from `args`, the inputs of the stitching module
    `stitching`: a plan of one replay over all of it, returning the capture's outputs (non-owning aliases:
    valid until the next replay). `all_checks`: every tensor input; `cheap_checks`: those the caller owns."""

    def __init__(
        self, padded_size: int, cuda_graph: Any, outputs: Any, stitching: torch.fx.GraphModule, args: Sequence
    ) -> None:
        nodes = stitching.graph.find_nodes(op="placeholder")
        tensors = [(i, n, a) for i, (n, a) in enumerate(zip(nodes, args)) if isinstance(a, torch.Tensor)]
        every = tuple(AddressCheck(i, a.data_ptr(), "full graph", i, n.name) for i, n, a in tensors)
        aliases = tree_map(non_owning_alias, outputs)
        step = Step("full graph", "cuda_graph", replay_step(cuda_graph, []))
        cheap = _caller_owned(every, args)
        super().__init__(padded_size, (step,), 0, _Ref(_CONST, aliases), cheap, every, (), (aliases,))


def _caller_owned(checks: Sequence[AddressCheck], args: Sequence[Any]) -> tuple[AddressCheck, ...]:
    """The `checks` of inputs that are not parameters (whose address only moves when someone replaces
    them)."""
    return tuple(c for c in checks if not isinstance(args[c.index], torch.nn.Parameter))


def _is_constant(ref_tree: Any) -> bool:
    return all(r.where == _CONST for r in tensors_in(ref_tree, _Ref))


def _value(ref_tree: Any, args: Sequence[Any], slots: list) -> Any:
    # per place (_CONST, _INPUT, _SLOT): what `at` indexes; a constant is its value
    indexed: tuple[Any, ...] = (None, args, slots)
    return tree_map(lambda ref: ref.at if ref.where == _CONST else indexed[ref.where][ref.at], ref_tree)


def _ref_tree(arg: Any, refs: dict[torch.fx.Node, _Ref]) -> Any:
    """The ref tree of an FX argument: nodes become their refs, literals become constants."""
    return tree_map(lambda a: refs[a] if isinstance(a, torch.fx.Node) else _Ref(_CONST, a), arg)


def _getter(ref_tree: Any) -> Callable[[Sequence[Any], list], Any]:
    if _is_constant(ref_tree):
        value = _value(ref_tree, (), [])
        return lambda args, slots: value
    if isinstance(ref_tree, _Ref):  # not a constant: a graph input or a slot
        at = ref_tree.at
        return (lambda args, slots: args[at]) if ref_tree.where == _INPUT else (lambda args, slots: slots[at])
    return lambda args, slots: _value(ref_tree, args, slots)


def _eager_step(fn: Callable[..., Any], arg_refs: list, slot: int) -> StepFn:
    getters = [_getter(r) for r in arg_refs]

    def run(args: Sequence[Any], slots: list) -> None:
        slots[slot] = fn(*[g(args, slots) for g in getters])

    return run


def replay_step(cuda_graph: Any, moved: list[tuple[int, torch.Tensor]]) -> StepFn:
    """A step replaying `cuda_graph`. `moved`: (slot, captured tensor) for each eager output the graph reads;
    one that is not where the capture saw it is copied there first."""
    replay = cuda_graph.replay

    def run(args: Sequence[Any], slots: list) -> None:
        for j, captured in moved:
            if slots[j].data_ptr() != captured.data_ptr():
                captured.copy_(slots[j])
        replay()

    run.cuda_graph = cuda_graph  # type: ignore[attr-defined]
    return run


def _callable(split_gm: torch.fx.GraphModule, node: torch.fx.Node) -> tuple[Callable, Sequence[int]]:
    """`(fn, positions)`: what an eager step of `node` (a `call_module`, or a `call_function`: the stitching
    module has no other calls, and passes no keywords) calls, and the positions of the arguments it calls it
    on: all of them, but for a splitting piece that is one op on some of its inputs (attention is), which is
    called as that op, `op(*[inputs[p] for p in positions])`, without the piece's FX frame."""
    fn: Any = getattr(split_gm, cast(str, node.target)) if node.op == "call_module" else node.target
    all_positions = range(len(node.args))
    if not isinstance(fn, torch.fx.GraphModule):  # a function, or a compiled piece that runs eagerly
        return fn, all_positions
    position = {p: i for i, p in enumerate(fn.graph.find_nodes(op="placeholder"))}  # input -> its position
    body = [n for n in fn.graph.nodes if n.op not in ("placeholder", "output")]
    op: Any = body[0] if len(body) == 1 and body[0].op == "call_function" and not body[0].kwargs else None
    on_inputs = op is not None and all(isinstance(a, torch.fx.Node) and a in position for a in op.args)
    if not on_inputs or (node.users and fn.graph.output_node().args[0] is not op):
        return fn.forward, all_positions
    return op.target, [position[a] for a in op.args]


def record_plan(
    split_gm: torch.fx.GraphModule,
    padded_size: int,
    args: Sequence[Any],
    capturable: dict[str, Piece],
    capture: Callable[..., tuple[Any, Any]],
) -> tuple[ReplayPlan, Any]:
    """Run `split_gm(*args)` once, capturing the pieces in `capturable` (by name); return the plan and
    this run's (owning) outputs. `capture(fn, args, mutated, padded_size)` returns `(cuda_graph, outputs)`
    with the outputs already computed."""
    real: dict[torch.fx.Node, Any] = dict(zip(split_gm.graph.find_nodes(op="placeholder"), args))
    refs = {node: _Ref(_INPUT, i) for i, node in enumerate(real)}  # the graph inputs, in order
    every: dict[int, AddressCheck] = {}
    steps, keep, aliases, num_slots = [], [], [], 0  # aliases: per graph, of the outputs a replay writes
    last_use = {inp: node for node in split_gm.graph.nodes for inp in node.all_input_nodes}
    # every node but the inputs (their values are `args`) and the output (read after the loop)
    for node in [n for n in split_gm.graph.nodes if n.op not in ("placeholder", "output")]:
        call_args = torch.fx.node.map_arg(node.args, real.__getitem__)
        arg_refs = [_ref_tree(a, refs) for a in node.args]
        if node.op == "get_attr":
            value = operator.attrgetter(node.target)(split_gm)
            real[node], refs[node] = value, _Ref(_CONST, value)
        elif node.op == "call_module" and (piece := capturable.get(node.target)) is not None:
            fn = piece.runnable_for(call_args)
            cuda_graph, out = capture(fn, call_args, piece.mutated_inputs, padded_size)
            moved, reader = [], f"piece {piece.submod_name} (graph {piece.graph_id})"
            for position, (value, ref, name) in enumerate(zip(call_args, arg_refs, piece.placeholder_names)):
                where = ref.where if isinstance(value, torch.Tensor) and isinstance(ref, _Ref) else None
                # a graph input: the first graph reading it checks it
                if where == _INPUT and ref.at not in every:
                    every[ref.at] = AddressCheck(ref.at, value.data_ptr(), reader, position, name)
                elif where == _SLOT:
                    moved.append((ref.at, value))
                    keep.append(value)
            steps.append(Step(str(node.target), "cuda_graph", replay_step(cuda_graph, moved)))
            real[node], refs[node] = out, _Ref(_CONST, tree_map(non_owning_alias, out))
            aliases.append(refs[node].at)
        elif node.op == "call_function" and node.target is operator.getitem and _is_constant(arg_refs[0]):
            real[node] = operator.getitem(*call_args)
            refs[node] = _Ref(_CONST, _value(arg_refs[0], (), [])[node.args[1]])
        else:  # an eager step (a splitting piece that is one op: that op, without the piece's FX frame)
            fn, positions = _callable(split_gm, node)
            call_args, arg_refs = tuple(call_args[p] for p in positions), [arg_refs[p] for p in positions]
            real[node], refs[node] = fn(*call_args), _Ref(_SLOT, num_slots)
            steps.append(Step(str(node.target), "eager", _eager_step(fn, arg_refs, num_slots)))
            num_slots += 1
        # Drop this run's values after their last use, as the stitching module's own code does, so that later
        # pieces' captures can reuse the pool blocks of values that are dead by then.
        for inp in node.all_input_nodes:
            if last_use[inp] is node:
                real.pop(inp, None)
    checks, output = tuple(every.values()), split_gm.graph.output_node().args[0]
    ref, cheap = _ref_tree(output, refs), _caller_owned(checks, args)
    plan = ReplayPlan(padded_size, tuple(steps), num_slots, ref, cheap, checks, tuple(keep), tuple(aliases))
    return plan, torch.fx.node.map_arg(output, real.__getitem__)
