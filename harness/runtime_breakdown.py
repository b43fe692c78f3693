"""Where a PIECEWISE forward's time goes, next to its peers, on ToyLlama: CUDA events, ratios.

`python -m pieceworks.harness.runtime_breakdown [--out results/runtime_breakdown.json]` (CUDA only; about 2-4 min on
an H100 for 12 layers, two dtypes, four batch sizes). For each dtype and batch it times these side by side, with
CUDA events after warm-up, in `--rounds` rounds whose order rotates (`timing.interleaved_cuda_time_us`: a slow spell
of a shared host falls on all of them alike), reporting median, p25 and p75 in µs:
- `compiled call`: `CompiledModel.__call__` in PIECEWISE mode (argument checks, static copy, plan, cut back);
- `plan run`: the replay plan of the padded size alone, on the static buffers (no checks, no copies);
- `graph replays`: the plan's piece graphs replayed back to back; `splitting ops`: its eager steps alone;
- `FULL`: pieceworks FULL (the pieces of the split captured as one graph, as vLLM's FULL keeps them); `FULL
  unsplit`: FULL with `splitting_ops=[]` (one compiled graph, the splitting op inside it); `reduce-overhead`:
  `torch.compile(mode="reduce-overhead")`; `meta-pcg`: Meta's piecewise-cuda-graphs (skipped, with the reason,
  when the package or its harness adapter is absent);
and derives: PIECEWISE / meta-pcg, compiled call / plan run, FULL (and FULL unsplit) / reduce-overhead (each the
median of the per-round ratios, with their minimum and maximum), and host overhead per piece =
(compiled call - graph replays - splitting ops) / pieces, negative where host work overlaps GPU work. Every variant's
output is compared with eager (max abs error), so a fast wrong answer shows. At the first batch, 100 compiled calls
and 100 plan runs also run under cProfile (`call_profile`: the functions whose own time the call adds over the plan,
in µs per call with the profiler's overhead), to explain a compiled call / plan run miss.

Robustness: each dtype runs in a child process of its own (a crash there, even a segfault, costs that dtype only
and is recorded with the child's exit status and last output); `faulthandler` prints the Python stack of a fatal
signal; every variant is first called once under its own try (one that fails is recorded and left out of the
timing, the others go on); each batch row is printed
as it is measured and `--out` is rewritten after each dtype, so partial results survive. `--only` names the variants
to build and time (e.g. `--only pieceworks,meta-pcg`), for bisecting a crash.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any

import torch

import pieceworks
from pieceworks import CompilationConfig, CUDAGraphMode, default_capture_sizes

from . import breakdown, models
from .provenance import code_commit
from .profile import host_profile
from .timing import interleaved_cuda_time_us, ratio_over_rounds


def _pieceworks(model: torch.nn.Module, mode: CUDAGraphMode, sizes: list[int], cache: str, make: Any,
                splitting_ops: list[str] = models.SPLITTING_OPS) -> Any:
    config = CompilationConfig(splitting_ops=splitting_ops, cudagraph_mode=mode, cudagraph_capture_sizes=sizes,
                               cache_dir=cache)
    compiled = pieceworks.compile(model, config)
    compiled(*make(3))
    compiled.capture()
    return compiled


def _peer(name: str, model: torch.nn.Module, make: Any, sizes: list[int]) -> tuple[Any, str | None]:
    """A harness adapter's build of `name`, or (None, why not)."""
    try:
        from .implementations import resolve

        impl = resolve(name)
    except (ImportError, KeyError) as exc:
        return None, f"no harness adapter {name!r} ({exc})"
    reason = impl.unavailable_reason()
    if reason is not None:
        return None, reason
    return impl.build(model, make, sizes, models.SPLITTING_OPS), None


def _plan_parts(compiled: Any, batch: int) -> dict[str, Any]:
    """The PIECEWISE plan of `batch`'s padded size, and callables for its parts, on the static buffers."""
    plan, flat = breakdown.static_replay(compiled, batch)
    slots = [None] * plan.num_slots
    for step in plan.steps:  # one forward into `slots`: the values later eager steps read
        step.run(flat, slots)
    eager = [step.run for step in plan.steps if step.kind == "eager"]
    graphs = plan.graphs

    def replays() -> None:
        for g in graphs:
            g.replay()

    def splitting() -> None:
        for step in eager:
            step(flat, slots)

    return {"plan": lambda: plan.run(flat, ()), "replays": replays, "splitting": splitting,
            "pieces": len(graphs) + len(eager)}


def _say(text: str) -> None:
    print(text, flush=True)


def _measure_dtype(dtype: torch.dtype, args: argparse.Namespace, cache: str) -> dict[str, Any]:
    torch.manual_seed(0)
    config = models.ToyLlamaConfig(num_layers=args.layers)
    model = models.ToyLlama(config).cuda().to(dtype)
    batches = [int(b) for b in args.batches.split(",")]
    sizes = default_capture_sizes(max(batches))
    make = lambda b: models.toy_llama_inputs(b, config, "cuda", seed=b)  # noqa: E731
    only = set(args.only.split(",")) if args.only else {"pieceworks", "meta-pcg", "reduce-overhead"}
    report: dict[str, Any] = {"skipped": {}, "errors": {}, "build_s": {}}
    built: dict[str, Any] = {}
    # Peers after pieceworks, reduce-overhead last: it resets Dynamo, and its graph trees clear cuBLAS workspaces
    # and empty the cache when they record (both pieceworks and the meta-pcg adapter keep their workspaces in a
    # MemPool of their own, so that cannot free memory their graphs use).
    steps = [("PIECEWISE", lambda: _pieceworks(model, CUDAGraphMode.PIECEWISE, sizes, cache, make)),
             ("FULL", lambda: _pieceworks(model, CUDAGraphMode.FULL, sizes, cache, make)),
             ("FULL unsplit", lambda: _pieceworks(model, CUDAGraphMode.FULL, sizes, cache, make, splitting_ops=[])),
             ("meta-pcg", lambda: _peer("meta-pcg", model, make, sizes)),
             ("reduce-overhead", lambda: _peer("reduce-overhead", model, make, batches))]
    with torch.no_grad():
        for name, build in steps:
            if ("pieceworks" if name in ("PIECEWISE", "FULL", "FULL unsplit") else name) not in only:
                report["skipped"][name] = "not in --only"
                continue
            start = time.perf_counter()
            try:
                found = build()
            except Exception as exc:  # noqa: BLE001 - recorded; the other variants go on
                report["errors"][f"build {name}"] = "".join(traceback.format_exception_only(exc)).strip()
                _say(f"  build {name}: FAILED {report['errors'][f'build {name}']}")
                continue
            if isinstance(found, tuple):
                found, why = found
                if found is None:
                    report["skipped"][name] = why
                    _say(f"  build {name}: skipped ({why})")
                    continue
            built[name] = found
            report["build_s"][name] = time.perf_counter() - start
            _say(f"  build {name}: {report['build_s'][name]:.1f} s")
    piecewise = built.get("PIECEWISE")
    report["direct_calls"] = piecewise is not None and piecewise.binder is not None
    rows = report["batches"] = {}
    with torch.no_grad():
        for batch in batches:
            inputs = make(batch)
            expected = model(*inputs)
            variants: dict[str, Any] = {}
            pieces = None
            if piecewise is not None:
                variants["compiled call"] = lambda: piecewise(*inputs)
                try:
                    parts = _plan_parts(piecewise, batch)
                except Exception as exc:  # noqa: BLE001
                    report["errors"][f"plan parts {batch}"] = "".join(traceback.format_exception_only(exc)).strip()
                else:
                    variants.update({"plan run": parts["plan"], "graph replays": parts["replays"],
                                     "splitting ops": parts["splitting"]})
                    pieces = parts["pieces"]
            for name in ("FULL", "FULL unsplit", "meta-pcg", "reduce-overhead"):
                if name in built:
                    variants[name] = lambda fn=built[name]: fn(*inputs)
            errors: dict[str, float] = {}
            for name, fn in list(variants.items()):  # one checked call each; a variant that fails is left out
                try:
                    out = fn()
                    if name in ("compiled call", "FULL", "FULL unsplit", "meta-pcg", "reduce-overhead"):
                        errors[name] = float((out.float() - expected.float()).abs().max())
                except Exception as exc:  # noqa: BLE001 - recorded; a CUDA error here poisons the rest too
                    report["errors"][f"{name} batch {batch}"] = "".join(traceback.format_exception_only(exc)).strip()
                    del variants[name]
            try:
                row = interleaved_cuda_time_us(variants, warmup=args.warmup, reps=args.reps, rounds=args.rounds)
            except Exception as exc:  # noqa: BLE001 - recorded; the next batch may still run
                report["errors"][f"timing batch {batch}"] = "".join(traceback.format_exception_only(exc)).strip()
                continue
            for name, error in errors.items():
                row[name]["max_abs_error_vs_eager"] = error
            med = {k: v["median_us"] for k, v in row.items()}
            ratio = lambda a, b: ratio_over_rounds(row[a], row[b]) if a in row and b in row else None  # noqa: E731
            ratios = {"PIECEWISE / meta-pcg": ratio("compiled call", "meta-pcg"),
                      "compiled call / plan run": ratio("compiled call", "plan run"),
                      "FULL / reduce-overhead": ratio("FULL", "reduce-overhead"),
                      "FULL unsplit / reduce-overhead": ratio("FULL unsplit", "reduce-overhead")}
            entry = rows[str(batch)] = {"us": row, "ratios": ratios, "pieces": pieces}
            if pieces and all(k in med for k in ("compiled call", "graph replays", "splitting ops")):
                overhead = med["compiled call"] - med["graph replays"] - med["splitting ops"]
                entry["host_overhead_per_piece_us"] = overhead / pieces
            _print_row(batch, entry)
            if piecewise is not None and "plan run" in variants and "call_profile" not in report:
                report["call_profile"] = _call_profile(batch, variants["compiled call"], variants["plan run"])
    return report


def _call_profile(batch: int, call: Any, plan: Any, calls: int = 100) -> dict[str, Any]:
    """Where the compiled call's host time goes beyond its plan run: `calls` of each under cProfile
    (`profile.host_profile`, every function), and the functions whose own time the call adds, most first."""
    profiles = {name: host_profile(lambda fn=fn: [fn() for _ in range(calls)], top=None)
                for name, fn in (("compiled call", call), ("plan run", plan))}
    own = {name: {r["function"]: r for r in p["top"]} for name, p in profiles.items()}
    added = []
    for function, row in own["compiled call"].items():
        extra = row["tottime_s"] - own["plan run"].get(function, {}).get("tottime_s", 0.0)
        if extra > 0:
            added.append({"function": function, "us_per_call": 1e6 * extra / calls,
                          "calls_per_call": row["calls"] / calls})
    added.sort(key=lambda r: -r["us_per_call"])
    return {"batch": batch, "calls": calls, "seconds": {k: p["seconds"] for k, p in profiles.items()},
            "added": added[:8]}


def _print_row(batch: Any, row: dict[str, Any]) -> None:
    cells = "  ".join(f"{k} {v['median_us']:.1f} [{v['p25_us']:.1f}-{v['p75_us']:.1f}]" for k, v in row["us"].items())
    ratios = "  ".join(f"{k} {v['median']:.3f} [{v['min']:.3f}-{v['max']:.3f}]" for k, v in row["ratios"].items()
                       if v is not None)
    overhead = row.get("host_overhead_per_piece_us")
    tail = f"  host overhead/piece {overhead:.2f} us ({row['pieces']} pieces)" if overhead is not None else ""
    _say(f"  batch {batch:>4}: {cells}\n              {ratios}{tail}")


def _child(dtype: str, argv: list[str], out: str) -> dict[str, Any]:
    """Run one dtype in a child process (its output streams through); its report, or what killed it."""
    cmd = [sys.executable, "-m", "pieceworks.harness.runtime_breakdown", *argv, "--dtypes", dtype, "--out", out,
           "--in-process"]
    proc = subprocess.run(cmd, stderr=subprocess.PIPE, text=True)
    sys.stderr.write(proc.stderr[-20000:])
    if proc.returncode == 0 and os.path.exists(out):
        with open(out) as f:
            return json.load(f)["dtypes"][dtype]
    return {"crashed": {"exit_status": proc.returncode, "stderr_tail": proc.stderr[-6000:]}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batches", default="1,8,64,256")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=10, help="rounds of interleaved timing (order rotated)")
    parser.add_argument("--only", default="", help="comma-separated: pieceworks, meta-pcg, reduce-overhead")
    parser.add_argument("--out", default=None)
    parser.add_argument("--in-process", action="store_true", help="measure here, not in a child per dtype")
    argv = sys.argv[1:] if argv is None else argv
    args = parser.parse_args(argv)
    faulthandler.enable(all_threads=True)
    if not torch.cuda.is_available():
        sys.exit("runtime_breakdown needs CUDA: torch sees no CUDA device")
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": f"ToyLlama layers={args.layers}", "reps": args.reps, "rounds": args.rounds, "commit": code_commit(),
        "dtypes": {},
    }
    _say(f"{report['device']} | torch {report['torch']} | {report['model']} | {report['date']}")
    work = tempfile.TemporaryDirectory(prefix="pieceworks-breakdown-", ignore_cleanup_errors=True)
    with work as cache:
        _measure_dtypes(args, argv, cache, report)
    return report


def _measure_dtypes(args: argparse.Namespace, argv: list[str], cache: str, report: dict[str, Any]) -> None:
    """Each dtype in a child process of its own (or in this one), its caches under `cache`; `report` filled in."""
    passed = _without([a for a in argv if a != "--in-process"], ("--dtypes", "--out"))
    for name in args.dtypes.split(","):
        _say(f"\n{name}:")
        if args.in_process:
            result = _measure_dtype(getattr(torch, name), args, cache)
        else:
            result = _child(name, passed, os.path.join(cache, f"{name}.json"))
            if "crashed" in result:
                _say(f"  {name}: the child process died (exit status {result['crashed']['exit_status']}); see "
                     f"its output above (faulthandler prints the Python stack of a fatal signal)")
        report["dtypes"][name] = result
        if args.out:  # rewritten after each dtype: partial results survive a later crash
            with open(args.out, "w") as f:
                json.dump(report, f, indent=1)


def _without(argv: list[str], options: tuple[str, ...]) -> list[str]:
    """`argv` without the given options and their values (either `--opt value` or `--opt=value`)."""
    kept, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a in options:
            skip = True
        elif not a.startswith(tuple(o + "=" for o in options)):
            kept.append(a)
    return kept


if __name__ == "__main__":
    main()
