"""Where a pieceworks forward's time goes: its pieces' own work timed alone, the rest host overhead; side by side.

`record` returns one forward's pieces as `PieceWork` callables that redo only their own work; `measure` times the
forward and that work (the difference: host overhead); `replay_run` is the replay alone, the baseline of
`CompiledModel.__call__`. `python -m pieceworks.harness.breakdown` (CUDA) times ToyLlama's PIECEWISE call and parts,
FULL, FULL unsplit and the peers `--only` names side by side in rotating rounds, each dtype in a process of its own
(a crash costs that dtype only); docs/benchmarks.md says what it writes. A variant that fails is left out, its error
recorded.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import faulthandler
import functools
import json
import multiprocessing
import operator
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any
from unittest import mock

import torch
import torch.fx

from pieceworks import FullGraph, Phase, default_capture_sizes, padded_size

from . import models
from .profile import host_profile
from .provenance import code_commit
from .timing import interleaved_cuda_time_us, ratio_over_rounds

__all__ = ["PieceWork", "record", "measure", "replay_run", "main"]

VARIANTS = {"PIECEWISE": ("pieceworks-piecewise", models.SPLITTING_OPS),
            "FULL": ("pieceworks-full", models.SPLITTING_OPS), "FULL unsplit": ("pieceworks-full", [])}
RATIOS = {"PIECEWISE / meta-pcg": ("compiled call", "meta-pcg"), "compiled call / plan run": ("compiled call", "plan run"),
          "FULL / reduce-overhead": ("FULL", "reduce-overhead"),
          "FULL unsplit / reduce-overhead": ("FULL unsplit", "reduce-overhead")}
LAYERS, REPS = 12, 200  # ToyLlama's layers; samples per variant and batch (after 20 warm-up calls)
PARTS = ("plan run", "graph replays", "splitting ops")  # not checked against eager: they return graph buffers


@dataclasses.dataclass
class PieceWork:
    """One piece's own work in a recorded forward: `run()` redoes it, returning what the piece (or graph) returned."""

    name: str
    splitting: bool
    graph_replay: bool
    run: Callable[[], Any]


def _splitting_work(gm: torch.fx.GraphModule, args: tuple) -> Callable[[], Any]:
    """The splitting piece's one op called on `args`; its module called where it is more than one op on its inputs."""
    env = dict(zip((n for n in gm.graph.nodes if n.op == "placeholder"), args))
    ops = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is not operator.getitem]
    if len(ops) != 1 or any(i not in env for i in ops[0].all_input_nodes):
        return lambda: gm(*args)
    target, call_args, call_kwargs = ops[0].target, *(torch.fx.node.map_arg(a, env.__getitem__)
                                                        for a in (ops[0].args, ops[0].kwargs))
    return lambda: target(*call_args, **call_kwargs)


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
    """Call `compiled(*args)` (a traced `pieceworks.CompiledModel`) once; return its output and the pieces' work:
    the replay's steps where the call replays, else each piece on the arguments a second run of the stitching module
    gives it (the graph inputs it writes in place put back). Raises ValueError where calls go through Dynamo."""
    runtime = compiled.runtime
    if runtime is None or compiled.binder is None:
        raise ValueError("record() needs a traced model whose calls bind directly: call it once first (the first "
                         "call traces and compiles)")
    batch = next(a.shape[0] for a in args if isinstance(a, torch.Tensor))
    # the padded size `CompiledModel.__call__` runs at: static buffers exist once the runtime stops waiting
    padded = padded_size(compiled.config.cudagraph_capture_sizes, batch) \
        if compiled.static_inputs is not None and runtime.phase is not Phase.WAITING else None
    replay_of = runtime.replay_for(padded) if padded is not None else None
    out = compiled(*args)
    if isinstance(replay_of, FullGraph):
        return out, [_graph_replay("full graph", replay_of.graphs[0], replay_of.graph_outputs[0])]
    if replay_of is not None:
        return out, _plan_work(compiled, replay_of, padded)
    flat = compiled.graph_inputs(padded) if padded is not None else compiled.binder.inputs(list(args), batch)
    saved = [(flat[i], flat[i].clone()) for i in runtime.graph.mutated_inputs if isinstance(flat[i], torch.Tensor)]
    recorder = _RecordPieceCalls(runtime.graph)
    with torch.no_grad():
        recorder.run(*flat)
        for tensor, before in saved:
            tensor.copy_(before)
    # a compiled piece's work: the code compiled for this batch size, called without dispatch
    return out, [PieceWork(piece.submod_name, piece.is_splitting_graph, False, _splitting_work(piece.graph, a)
                           if piece.is_splitting_graph else functools.partial(piece.runnable_for(a), *a))
                 for piece, a in recorder.calls]


def _graph_replay(name: str, graph: Any, outputs: Any) -> PieceWork:
    def replay() -> Any:
        graph.replay()
        return outputs

    return PieceWork(name, splitting=False, graph_replay=True, run=replay)


def _plan_work(compiled: Any, plan: Any, n: int) -> list[PieceWork]:
    """A PIECEWISE plan's pieces in order, on the static buffers of size `n` (glue steps such as getitem are none)."""
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
            work.append(_graph_replay(step.name, *next(graphs)))
            continue
        if step.name in pieces:

            def run(step: Any = step, slot: int = slot) -> Any:
                step.run(flat, slots)
                return slots[slot]

            work.append(PieceWork(step.name, pieces[step.name].is_splitting_graph, False, run))
        slot += 1  # every eager step writes the next slot
    return work


def replay_run(compiled: Any, batch: int) -> Callable[[], Any]:
    """The replay (plan or FULL graph) of `batch`'s padded size on the static buffers of a captured
    `pieceworks.CompiledModel`, as its call runs it (no checks, no copies); ValueError where there is none."""
    runtime = compiled.runtime
    if runtime is None or compiled.binder is None:
        raise ValueError("replay_run() needs a traced, captured model whose calls bind directly (no Dynamo fallback)")
    n = min((s for s in runtime.captured_sizes if s >= batch), default=None)
    if n is None:
        raise ValueError(f"no captured size >= {batch} ({sorted(runtime.captured_sizes)}): call capture() first")
    replay, flat = runtime.replay_for(n), compiled.graph_inputs(n)
    return lambda: replay.run(flat, ())


def _in_order(fns: list[Callable[[], Any]]) -> Callable[[], None]:
    def run() -> None:
        for fn in fns:
            fn()

    return run


def measure(forward: Callable[[], Any], work: Sequence[PieceWork], time_us: Callable[..., dict[str, float]],
            replay: Callable[[], Any] | None = None) -> dict[str, float]:
    """Median µs of `forward()`, of the compiled pieces' and of the splitting pieces' work (each back to back), each
    timed by `time_us` (timing.cuda_time_us, host_time_us), and the rest: host overhead, per forward and per piece.
    With `replay` (`replay_run`): its median µs and forward / replay."""
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
    return extra | {"forward_us": forward_us, "compiled_pieces_alone_us": compiled_us,
                    "splitting_ops_alone_us": splitting_us, "overhead_us": overhead, "pieces": len(work),
                    "graph_replays": sum(w.graph_replay for w in work),
                    "overhead_per_piece_us": overhead / len(work) if work else float("nan")}


# ---- the side-by-side run (CLI) ------------------------------------------------------------------------------
def _error(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(exc)).strip()


def _build_all(model: Any, make: Any, batches: list[int], only: list[str], report: dict[str, Any]) -> dict[str, Any]:
    """The variants `only` names ("pieceworks": `VARIANTS`), built from the harness registry, reduce-overhead last
    (it resets Dynamo); their build seconds, skip reasons and failures go to `report`."""
    from .implementations import resolve

    sizes = default_capture_sizes(max(batches))
    peers = sorted(set(only) - {"pieceworks"}, key=lambda n: (n == "reduce-overhead", only.index(n)))
    built = {}
    for variant in [v for v in VARIANTS if "pieceworks" in only] + peers:
        name, splitting_ops = VARIANTS.get(variant, (variant, models.SPLITTING_OPS))
        start = time.perf_counter()
        try:
            impl = resolve(name)
            why = impl.unavailable_reason()
            if why is None:
                built[variant] = impl.build(model, make, sizes if impl.capabilities.padding else batches,
                                            splitting_ops)
                report["build_s"][variant] = time.perf_counter() - start
                why = f"{report['build_s'][variant]:.1f} s"
            else:
                report["skipped"][variant] = why
        except Exception as exc:  # noqa: BLE001 - recorded; the other variants go on
            why = report["errors"][f"build {variant}"] = _error(exc)
        print(f"  build {variant}: {why}", flush=True)
    return built


def _row(built: dict[str, Any], model: Any, inputs: tuple, batch: int, rounds: int,
         report: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """One batch: the variants (PIECEWISE as its call and `PARTS`), each called once and checked against eager (one
    that fails is recorded and left out), then timed side by side. Returns the row (None where the timing failed:
    recorded) and the callables timed."""
    variants = {("compiled call" if v == "PIECEWISE" else v): (lambda fn=b.fn: fn(*inputs)) for v, b in built.items()}
    pieces = None
    if "PIECEWISE" in built:
        compiled = built["PIECEWISE"].fn
        try:
            _, work = record(compiled, inputs)
            parts = {"plan run": replay_run(compiled, batch),
                     "graph replays": _in_order([w.run for w in work if w.graph_replay]),
                     "splitting ops": _in_order([w.run for w in work if not w.graph_replay])}  # eager steps
            variants, pieces = {"compiled call": variants.pop("compiled call"), **parts, **variants}, len(work)
        except Exception as exc:  # noqa: BLE001 - recorded; the call and the peers are still timed
            report["errors"][f"plan parts {batch}"] = _error(exc)
    expected, errors = model(*inputs).float(), {}
    for name, fn in list(variants.items()):
        try:
            out = fn()
            if name not in PARTS:
                errors[name] = float((out.float() - expected).abs().max())
        except Exception as exc:  # noqa: BLE001 - recorded; a CUDA error here poisons the rest too
            report["errors"][f"{name} batch {batch}"] = _error(exc)
            del variants[name]
    try:
        us = interleaved_cuda_time_us(variants, reps=REPS, rounds=rounds)
    except Exception as exc:  # noqa: BLE001 - recorded; the next batch may still run
        report["errors"][f"timing batch {batch}"] = _error(exc)
        return None, variants
    for name, error in errors.items():
        us[name]["max_abs_error_vs_eager"] = error
    row = {"us": us, "pieces": pieces, "ratios": {label: ratio_over_rounds(us[a], us[b]) if a in us and b in us
                                                  else None for label, (a, b) in RATIOS.items()}}
    return row, variants


def _measure_dtype(dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    """One dtype's part of the report: builds, skips, errors, a row per batch and the call profile."""
    torch.manual_seed(0)
    config = models.ToyLlamaConfig(num_layers=LAYERS)
    model = models.ToyLlama(config).cuda().to(getattr(torch, dtype))
    batches = [int(b) for b in args.batches.split(",")]
    make = lambda b: models.toy_llama_inputs(b, config, "cuda", seed=b)  # noqa: E731
    report: dict[str, Any] = {"skipped": {}, "errors": {}, "build_s": {}, "batches": {}}
    with torch.no_grad():
        built = _build_all(model, make, batches, args.only.split(","), report)
        for batch in batches:
            row, variants = _row(built, model, make(batch), batch, args.rounds, report)
            if row is None:
                continue
            report["batches"][str(batch)] = row
            print(f"  batch {batch:>4}: " + "  ".join(f"{k} {v['median_us']:.1f} us" for k, v in row["us"].items()),
                  flush=True)
            if {"compiled call", "plan run"} <= row["us"].keys() and "call_profile" not in report:
                report["call_profile"] = _call_profile(batch, variants["compiled call"], variants["plan run"])
    return report


def _call_profile(batch: int, call: Any, plan: Any, calls: int = 100) -> dict[str, Any]:
    """Where the compiled call's host time goes beyond its plan run: `calls` of each under cProfile, and the
    functions whose own time the call adds (µs and calls per call, most first, at most 8)."""
    profiles = {name: host_profile(lambda fn=fn: [fn() for _ in range(calls)], top=None)
                for name, fn in (("compiled call", call), ("plan run", plan))}
    plan_own = {r["function"]: r["tottime_s"] for r in profiles["plan run"]["top"]}
    added = [{"function": r["function"], "us_per_call": 1e6 * (r["tottime_s"] - plan_own.get(r["function"], 0.0))
              / calls, "calls_per_call": r["calls"] / calls} for r in profiles["compiled call"]["top"]]
    added = sorted((a for a in added if a["us_per_call"] > 0), key=lambda a: -a["us_per_call"])
    return {"batch": batch, "calls": calls, "seconds": {k: p["seconds"] for k, p in profiles.items()},
            "added": added[:8]}


def _measure_to(out: str, dtype: str, args: argparse.Namespace) -> None:
    faulthandler.enable(all_threads=True)  # a fatal signal prints the Python stack
    with open(out, "w") as f:
        json.dump(_measure_dtype(dtype, args), f)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The side-by-side run (see the module's docstring): each dtype in a spawned process; returns the report."""
    parser = argparse.ArgumentParser(description="Side-by-side latency of PIECEWISE's parts and its peers (CUDA)")
    parser.add_argument("--batches", default="1,8,64,256")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of interleaved timing (order rotated)")
    parser.add_argument("--only", default="pieceworks,meta-pcg,reduce-overhead",
                        help="comma-separated: pieceworks (PIECEWISE, FULL, FULL unsplit) and harness implementations")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("the side-by-side run needs CUDA: torch sees no CUDA device")
    report: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                              "model": f"ToyLlama layers={LAYERS}", "reps": REPS, "rounds": args.rounds,
                              "commit": code_commit(), "dtypes": {}}
    print(f"{report['device']} | torch {report['torch']} | {report['model']} | {report['date']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="pieceworks-breakdown-", ignore_cleanup_errors=True) as work, \
            mock.patch.dict(os.environ, {"PIECEWORKS_CACHE_DIR": os.path.join(work, "cache")}):  # cold, shared
        for dtype in args.dtypes.split(","):
            print(f"\n{dtype}:", flush=True)
            out = os.path.join(work, f"{dtype}.json")
            child = multiprocessing.get_context("spawn").Process(target=_measure_to, args=(out, dtype, args))
            child.start()
            child.join()
            if child.exitcode == 0:
                with open(out) as f:
                    report["dtypes"][dtype] = json.load(f)
            else:  # a negative exit status is the signal that ended it
                report["dtypes"][dtype] = {"crashed": {"exit_status": child.exitcode}}
            if args.out:  # rewritten after each dtype: partial results survive a later crash
                with open(args.out, "w") as f:
                    json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
