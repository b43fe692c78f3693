"""Where a pieceworks forward's time goes: each piece's own work, timed alone, and the rest (the host overhead).

`record(compiled, args)` calls `compiled(*args)` once and returns, in run order, one `PieceWork` per piece the
forward ran: a callable that redoes only that piece's own work on the arguments the forward gave it:
- a compiled piece replayed from a CUDA graph: that graph's `replay()`;
- a compiled piece without a graph: the code compiled for that batch size (no dispatch, no address checks);
- a splitting piece: its splitting ops called directly (no FX module around them);
- FULL: the one graph's `replay()`.
`measure(...)` times the forward, the compiled pieces' work back to back and the splitting ops back to back with
one timer, and reports the difference as host overhead: the argument checks, static copies, dispatch and
stitching around the work. Where host work overlaps GPU work, the GPU-time overhead can be negative. Given
`replay_run(compiled, batch)` (the replay plan or FULL graph of the padded size run alone on the static buffers: no
argument checks, no static copies, no cut back), it also reports the forward / replay ratio: what
`CompiledModel.__call__` costs over its replay.

It reads the core's public view only (`CompiledModel.binder`, `static_inputs`, `graph_inputs`, `Runtime.phase`
and `replay_for`, the plans' `Step`s, run one by one into `num_slots` slots, the compiled graph's stitching module,
pieces and mutated inputs); suites/test_host_overhead.py checks that the recorded work recomputes the forward's
output, so a change that breaks it fails a test instead of skewing a number.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

from pieceworks.dispatch import padded_size
from pieceworks.plan import FullGraph
from pieceworks.runtime import Phase

__all__ = ["PieceWork", "record", "measure", "replay_run", "static_replay"]


@dataclasses.dataclass
class PieceWork:
    """One piece's own work in a recorded forward. `run()` redoes it and returns what the piece returned then
    (for a graph replay: the graph's outputs)."""

    name: str
    splitting: bool
    graph_replay: bool
    run: Callable[[], Any]


def _batch(args: Sequence[Any]) -> int:
    return next(a.shape[0] for a in args if isinstance(a, torch.Tensor))


def _splitting_work(gm: torch.fx.GraphModule, args: tuple) -> Callable[[], Any]:
    """The splitting piece's ops called directly on `args`; the piece's module call where its graph is more than
    ops on its inputs."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    env = dict(zip(placeholders, args))
    calls = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        if any(i not in env for i in node.all_input_nodes):
            return lambda: gm(*args)
        calls.append((node.target, torch.fx.node.map_arg(node.args, env.__getitem__),
                      torch.fx.node.map_arg(node.kwargs, env.__getitem__)))
    if len(calls) != 1:
        return lambda: gm(*args)
    target, call_args, call_kwargs = calls[0]
    return lambda: target(*call_args, **call_kwargs)


def _compiled_work(piece: Any, args: tuple) -> Callable[[], Any]:
    """A compiled piece's work alone: the code compiled for this batch size, without dispatch."""
    code = piece.runnable_for(args)
    return lambda: code(*args)


class _RecordPieceCalls(torch.fx.Interpreter):
    """Runs the stitching module and records each piece call with its arguments, in run order."""

    def __init__(self, graph: Any) -> None:
        super().__init__(graph.split_module)
        self.pieces = {p.submod_name: p for p in graph.pieces}
        self.calls: list[tuple[Any, tuple]] = []

    def call_module(self, target: Any, args: tuple, kwargs: dict) -> Any:
        self.calls.append((self.pieces[target], args))
        return super().call_module(target, args, kwargs)


def record(compiled: Any, args: Sequence[Any]) -> tuple[Any, list[PieceWork]]:
    """Call `compiled(*args)` (a traced `pieceworks.CompiledModel`) once; return its output and the pieces' work.

    Where that call replays (a FULL graph or a PIECEWISE plan of its padded size), the work is the replay's steps.
    Where it runs without graphs, the stitching module runs once more on the graph inputs the call ran on (the
    static buffers of its padded size, or the call's own arguments) to record each piece's arguments; the graph
    inputs it writes in place are put back after that run, so the model's state is what one call leaves."""
    runtime = compiled.runtime
    if runtime is None or compiled.binder is None:
        raise ValueError("record() needs a traced model whose calls bind directly: call it once first (the first "
                         "call traces and compiles)")
    batch = _batch(args)
    # The padded size the call runs at, as `CompiledModel.__call__` picks it: static buffers exist once the runtime
    # has left its waiting phase.
    padded = padded_size(compiled.config.cudagraph_capture_sizes, batch) \
        if compiled.static_inputs is not None and runtime.phase is not Phase.WAITING else None
    replay_of = runtime.replay_for(padded) if padded is not None else None
    out = compiled(*args)
    if isinstance(replay_of, FullGraph):
        graph, outputs = replay_of.graphs[0], replay_of.graph_outputs[0]

        def replay() -> Any:
            graph.replay()
            return outputs

        return out, [PieceWork("full graph", splitting=False, graph_replay=True, run=replay)]
    if replay_of is not None:
        return out, _plan_work(compiled, replay_of, padded)
    flat = compiled.graph_inputs(padded) if padded is not None else compiled.binder.inputs(list(args), batch)
    saved = [(flat[i], flat[i].clone()) for i in runtime.graph.mutated_inputs if isinstance(flat[i], torch.Tensor)]
    recorder = _RecordPieceCalls(runtime.graph)
    with torch.no_grad():
        recorder.run(*flat)
        for tensor, before in saved:
            tensor.copy_(before)
    work = []
    for piece, a in recorder.calls:
        if piece.is_splitting_graph:
            work.append(PieceWork(piece.submod_name, True, False, _splitting_work(piece.graph, a)))
        else:
            work.append(PieceWork(piece.submod_name, False, False, _compiled_work(piece, a)))
    return out, work


def _plan_work(compiled: Any, plan: Any, n: int) -> list[PieceWork]:
    """The pieces of a PIECEWISE replay plan, in its order, on the static buffers of padded size `n`: its graph
    replays, its splitting ops and its eagerly run compiled pieces (glue steps such as getitem are no piece)."""
    flat = compiled.graph_inputs(n)
    slots = [None] * plan.num_slots
    for step in plan.steps:  # one forward into `slots`: the values later eager steps read
        step.run(flat, slots)
    pieces = {p.submod_name: p for p in compiled.runtime.graph.pieces}
    graphs = iter(zip(plan.graphs, plan.graph_outputs))
    work = []
    slot = 0
    for step in plan.steps:
        if step.kind == "graph":
            graph, outputs = next(graphs)

            def replay(graph: Any = graph, outputs: Any = outputs) -> Any:
                graph.replay()
                return outputs

            work.append(PieceWork(step.name, splitting=False, graph_replay=True, run=replay))
            continue
        if step.name in pieces:

            def run(step: Any = step, slot: int = slot) -> Any:
                step.run(flat, slots)
                return slots[slot]

            work.append(PieceWork(step.name, splitting=pieces[step.name].is_splitting_graph, graph_replay=False,
                                  run=run))
        slot += 1  # every eager step writes the next slot
    return work


def replay_run(compiled: Any, batch: int) -> Callable[[], Any]:
    """The replay (PIECEWISE plan or FULL graph) of `batch`'s padded size, run alone on the static buffers of a
    traced and captured `pieceworks.CompiledModel`, as `CompiledModel.__call__` runs it (no checks)."""
    replay, flat = static_replay(compiled, batch)
    return lambda: replay.run(flat, ())


def static_replay(compiled: Any, batch: int) -> tuple[Any, list[Any]]:
    """`(replay, flat)`: the replay (PIECEWISE plan or FULL graph) of `batch`'s padded size and the graph inputs
    it runs on (the static buffers' views, parameters, the size)."""
    runtime = compiled.runtime
    if runtime is None or compiled.binder is None:
        raise ValueError("replay_run() needs a traced, captured model whose calls bind directly (no Dynamo fallback)")
    n = min((s for s in runtime.captured_sizes if s >= batch), default=None)
    if n is None:
        raise ValueError(f"no captured size >= {batch} (captured: {sorted(runtime.captured_sizes)}): call capture() "
                         f"first")
    return runtime.replay_for(n), compiled.graph_inputs(n)


def _in_order(fns: list[Callable[[], Any]]) -> Callable[[], None]:
    def run() -> None:
        for fn in fns:
            fn()

    return run


def measure(
    forward: Callable[[], Any], work: Sequence[PieceWork], time_us: Callable[[Callable[[], Any]], dict[str, float]],
    replay: Callable[[], Any] | None = None,
) -> dict[str, float]:
    """Median µs of `forward()`, of the compiled pieces' work back to back, and of the splitting ops back to back,
    each timed by `time_us` (e.g. timing.cuda_time_us or timing.host_time_us); the rest is host overhead. With
    `replay` (see `replay_run`): its median µs too, and forward / replay."""
    compiled_work = [w.run for w in work if not w.splitting]
    splitting_work = [w.run for w in work if w.splitting]
    forward_us = time_us(forward)["median_us"]
    compiled_us = time_us(_in_order(compiled_work))["median_us"] if compiled_work else 0.0
    splitting_us = time_us(_in_order(splitting_work))["median_us"] if splitting_work else 0.0
    overhead = forward_us - compiled_us - splitting_us
    extra = {}
    if replay is not None:
        replay_us = time_us(replay)["median_us"]
        extra = {"replay_run_us": replay_us, "call_over_replay": forward_us / replay_us}
    return extra | {
        "forward_us": forward_us,
        "compiled_pieces_alone_us": compiled_us,
        "splitting_ops_alone_us": splitting_us,
        "overhead_us": overhead,
        "pieces": len(work),
        "graph_replays": sum(w.graph_replay for w in work),
        "overhead_per_piece_us": overhead / len(work) if work else float("nan"),
    }
