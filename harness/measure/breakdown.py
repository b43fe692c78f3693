"""Where a pieceworks forward's time goes: its pieces' own work timed alone, the rest host overhead.

`record` returns one forward's pieces as `PieceWork` callables that redo only their own work, on the route the
model gives the call (`CompiledModel.route`); `measure` times the forward and that work (the difference: host
overhead); `replay_run` is the replay alone, the baseline of `CompiledModel.__call__`. side_by_side.py times
them side by side.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from pieceworks import uniform_decode
from pieceworks.core import FullReplay

__all__ = ["PieceWork", "record", "measure", "replay_run", "in_order"]


@dataclasses.dataclass
class PieceWork:
    """One piece's own work in a recorded forward: `run()` redoes it, returning what the piece (or graph)
    returned."""

    name: str
    splitting: bool
    graph_replay: bool
    run: Callable[[], Any]


def _splitting_work(gm: torch.fx.GraphModule, args: tuple) -> Callable[[], Any]:
    """The splitting piece's one op called on `args`; its module called where it is more than one op on its
    inputs."""
    env = dict(zip((n for n in gm.graph.nodes if n.op == "placeholder"), args))
    ops = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]
    if len(ops) != 1 or any(i not in env for i in ops[0].all_input_nodes):
        return lambda: gm(*args)
    target, call_args, call_kwargs = (
        ops[0].target,
        *(torch.fx.node.map_arg(a, env.__getitem__) for a in (ops[0].args, ops[0].kwargs)),
    )
    return lambda: target(*call_args, **call_kwargs)


class _RecordPieceCalls(torch.fx.Interpreter):
    """Runs the stitching module and records each piece call with its arguments, in run order."""

    def __init__(self, graph: Any) -> None:
        super().__init__(graph.stitching_module)
        self.pieces = {p.submod_name: p for p in graph.pieces}
        self.calls: list[tuple[Any, tuple]] = []

    def call_module(self, target: Any, args: tuple, kwargs: dict) -> Any:
        self.calls.append((self.pieces[target], args))
        return super().call_module(target, args, kwargs)


def record(compiled: Any, args: Sequence[Any], uniform: bool = False) -> tuple[Any, list[PieceWork]]:
    """Call `compiled(*args)` (a traced `pieceworks.CompiledModel`) once, a uniform decode batch where
    `uniform`; return its output and the pieces' work on the route the model gives the call
    (`CompiledModel.route`): the replay's steps where it replays, else each piece on the arguments a second
    run of the stitching module gives it (the graph inputs it writes in place put back). Raises ValueError
    where calls go through Dynamo."""
    runtime = compiled.runtime
    if runtime is None or compiled.binder is None:
        raise ValueError(
            "record() needs a traced model whose calls bind directly: call it once first (the first "
            "call traces and compiles)"
        )
    batch = next(a.shape[0] for a in args if isinstance(a, torch.Tensor))
    padded, replay_of = compiled.route(batch, uniform)
    with uniform_decode(uniform):
        out = compiled(*args)
    if isinstance(replay_of, FullReplay):
        return out, [_graph_replay("full graph", replay_of.cuda_graphs[0], replay_of.cuda_graph_outputs[0])]
    if replay_of is not None:
        return out, _plan_work(compiled, replay_of, padded)
    flat = compiled.graph_inputs(padded) if padded is not None else compiled.binder.inputs(list(args), batch)
    saved = [
        (flat[i], flat[i].clone())
        for i in runtime.compiled.mutated_inputs
        if isinstance(flat[i], torch.Tensor)
    ]
    recorder = _RecordPieceCalls(runtime.compiled)
    with torch.no_grad():
        recorder.run(*flat)
        for tensor, before in saved:
            tensor.copy_(before)
    # a compiled piece's work: the code compiled for this batch size, called without dispatch
    return out, [
        PieceWork(
            piece.submod_name,
            piece.is_splitting_graph,
            False,
            _splitting_work(piece.fx_graph, a)
            if piece.is_splitting_graph
            else functools.partial(piece.runnable_for(a), *a),
        )
        for piece, a in recorder.calls
    ]


def _graph_replay(name: str, graph: Any, outputs: Any) -> PieceWork:
    def replay() -> Any:
        graph.replay()
        return outputs

    return PieceWork(name, splitting=False, graph_replay=True, run=replay)


def _plan_work(compiled: Any, plan: Any, n: int) -> list[PieceWork]:
    """A PIECEWISE plan's pieces in order, on the static buffers of size `n` (glue steps such as getitem are
    none)."""
    flat = compiled.graph_inputs(n)
    slots = [None] * plan.num_slots
    for step in plan.steps:  # one forward into `slots`: the values later eager steps read
        step.run(flat, slots)
    pieces = {p.submod_name: p for p in compiled.runtime.compiled.pieces}
    graphs = iter(zip(plan.cuda_graphs, plan.cuda_graph_outputs))
    work = []
    slot = 0
    for step in plan.steps:
        if step.how == "cuda_graph":
            work.append(_graph_replay(step.name, *next(graphs)))
            continue
        if step.name in pieces:

            def run(step: Any = step, slot: int = slot) -> Any:
                step.run(flat, slots)
                return slots[slot]

            work.append(PieceWork(step.name, pieces[step.name].is_splitting_graph, False, run))
        slot += 1  # every eager step writes the next slot
    return work


def replay_run(compiled: Any, batch: int, uniform: bool = False) -> Callable[[], Any]:
    """The replay (plan or FULL graph) a call of `batch` rows (a uniform decode batch where `uniform`) runs on
    the static buffers of a captured `pieceworks.CompiledModel` (`CompiledModel.route`), as its call runs it
    (no checks, no copies); ValueError where the call replays none."""
    if compiled.runtime is None or compiled.binder is None:
        raise ValueError(
            "replay_run() needs a traced, captured model whose calls bind directly (no Dynamo fallback)"
        )
    n, replay = compiled.route(batch, uniform)
    if replay is None:
        raise ValueError(
            f"a call of batch {batch} replays no graph (captured sizes "
            f"{sorted(compiled.runtime.captured_sizes)}): call capture() first"
        )
    flat = compiled.graph_inputs(n)
    return lambda: replay.run(flat, ())


def in_order(fns: list[Callable[[], Any]]) -> Callable[[], None]:
    """One callable calling `fns` in order."""

    def run() -> None:
        for fn in fns:
            fn()

    return run


def measure(
    forward: Callable[[], Any],
    work: Sequence[PieceWork],
    time_us: Callable[..., dict[str, float]],
    replay: Callable[[], Any] | None = None,
    rounds: int = 5,
) -> dict[str, Any]:
    """Median µs over `rounds` rounds (each timing every part in turn with `time_us`: timing.cuda_time_us,
    host_time_us) of `forward()` and of the compiled and the splitting pieces' work (each back to back), and
    the rest: host overhead, per forward and per piece (with its per-round range). With `replay`
    (`replay_run`): its median µs and forward / replay."""
    parts = ([w.run for w in work if w.splitting is splitting] for splitting in (False, True))
    runs = [forward, *(in_order(fns) if fns else None for fns in parts)]
    samples = [[time_us(fn)["median_us"] if fn else 0.0 for fn in runs] for _ in range(rounds)]
    forward_us, compiled_us, splitting_us = (statistics.median(column) for column in zip(*samples))
    overheads, pieces = sorted(f - c - s for f, c, s in samples), max(len(work), 1)
    extra = {}
    if replay is not None:
        replay_us = time_us(replay)["median_us"]
        extra = {"replay_run_us": replay_us, "call_over_replay": forward_us / replay_us}
    return extra | {
        "forward_us": forward_us,
        "compiled_pieces_alone_us": compiled_us,
        "splitting_ops_alone_us": splitting_us,
        "overhead_us": statistics.median(overheads),
        "pieces": len(work),
        "graph_replays": sum(w.graph_replay for w in work),
        "overhead_per_piece_us": statistics.median(overheads) / pieces if work else float("nan"),
        "overhead_per_piece_range_us": [overheads[0] / pieces, overheads[-1] / pieces],
    }
