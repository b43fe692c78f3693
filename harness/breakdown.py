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

This reads pieceworks internals (the runtime's replay plans and FULL graphs, and its stitching module). It changes with the
runtime; suites/test_host_overhead.py checks that the recorded work recomputes the forward's output, so a change
that breaks it fails a test instead of skewing a number.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx

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
    code = piece.runnable_for(piece.locate_batch(args)) if hasattr(piece, "runnable_for") else piece
    return lambda: code(*args)


def record(compiled: Any, args: Sequence[Any]) -> tuple[Any, list[PieceWork]]:
    """Call `compiled(*args)` (a traced `pieceworks.CompiledModel`) once; return its output and the pieces' work."""
    from pieceworks.plan import ReplayPlan
    from pieceworks.runtime import Phase

    runtime = compiled.runtime
    if runtime is None:
        raise ValueError("record() needs a traced model: call it once first (the first call traces and compiles)")
    sizes = sorted(compiled.config.cudagraph_capture_sizes or [])
    batch = _batch(args)
    padded = next((s for s in sizes if s >= batch), None)
    replay_of = runtime.replays.get(padded) if runtime.phase is not Phase.COMPILING else None
    if replay_of is not None and not isinstance(replay_of, ReplayPlan):  # FULL
        out = compiled(*args)
        full = replay_of

        def replay() -> Any:
            full.graph.replay()
            return full.outputs

        return out, [PieceWork("full graph", splitting=False, graph_replay=True, run=replay)]
    if replay_of is not None and runtime.binder is not None:
        return compiled(*args), _plan_work(runtime, replay_of, padded)

    split_gm = runtime.split_gm
    calls: list[tuple[Any, tuple]] = []
    installed: dict[str, Any] = {}
    hooks = []
    for item in runtime.items:
        current = getattr(split_gm, item.submod_name)
        if isinstance(current, torch.nn.Module):  # splitting pieces stay FX submodules
            hooks.append(current.register_forward_pre_hook(lambda module, a, item=item: calls.append((item, a))))
            continue
        installed[item.submod_name] = current

        def recording(*a: Any, item: Any = item, fn: Any = current) -> Any:
            calls.append((item, a))
            return fn(*a)

        setattr(split_gm, item.submod_name, recording)
    try:
        out = compiled(*args)
    finally:
        for name, fn in installed.items():
            setattr(split_gm, name, fn)
        for hook in hooks:
            hook.remove()
    work = []
    for item, a in calls:
        if item.is_splitting_graph:
            work.append(PieceWork(item.submod_name, True, False, _splitting_work(item.graph, a)))
        else:
            work.append(PieceWork(item.submod_name, False, False, _compiled_work(installed[item.submod_name], a)))
    return out, work


def _plan_work(runtime: Any, plan: Any, n: int) -> list[PieceWork]:
    """The pieces of a PIECEWISE replay plan, in its order, on the static buffers of padded size `n`: its graph
    replays, its splitting ops and its eagerly run compiled pieces (glue steps such as getitem are no piece)."""
    flat = runtime.binder.inputs(runtime.static.views(n), n)
    slots = [None] * plan.num_slots
    for step in plan.steps:  # one forward into `slots`: the values later eager steps read
        step(flat, slots)
    splitting = {i.submod_name for i in runtime.items if i.is_splitting_graph}
    pieces = {i.submod_name for i in runtime.items}
    eager = set(plan.eager_steps)
    graphs = iter(zip(plan.graphs, plan.graph_outputs))
    work = []
    for index, (name, step) in enumerate(zip(plan.step_names, plan.steps)):
        if index not in eager:
            graph, outputs = next(graphs)

            def replay(graph: Any = graph, outputs: Any = outputs) -> Any:
                graph.replay()
                return outputs

            work.append(PieceWork(name, splitting=False, graph_replay=True, run=replay))
        elif name in pieces:

            def run(step: Any = step, index: int = len([e for e in plan.eager_steps if e < index])) -> Any:
                step(flat, slots)
                return slots[index]

            work.append(PieceWork(name, splitting=name in splitting, graph_replay=False, run=run))
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
    if runtime is None or runtime.binder is None or runtime.static is None:
        raise ValueError("replay_run() needs a traced, captured model whose calls bind directly (no Dynamo fallback)")
    n = min((s for s in runtime.replays if s >= batch), default=None)
    if n is None:
        raise ValueError(f"no captured size >= {batch} (captured: {sorted(runtime.replays)}): call capture() first")
    return runtime.replays[n], runtime.binder.inputs(runtime.static.views(n), n)


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
