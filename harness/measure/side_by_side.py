"""The side-by-side run: `python -m pieceworks.harness.measure.side_by_side` (CUDA) times ToyLlama's PIECEWISE
call and its parts (breakdown.py), FULL, FULL unsplit and the peers `--only` names side by side in rotating
rounds, each dtype in a process of its own (a crash costs that dtype only); docs/benchmarks.md says what it
writes. A variant that fails is left out, its error recorded.
"""

from __future__ import annotations

import argparse
import datetime
import faulthandler
import functools
import json
import multiprocessing
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any
from unittest import mock

import torch

from pieceworks import default_capture_sizes

from ..models import toy as models
from .breakdown import in_order, record, replay_run
from .profile import host_profile
from .provenance import code_commit
from .timing import interleaved_cuda_time_us, ratio_over_rounds

__all__ = ["main"]

VARIANTS = {
    "PIECEWISE": ("pieceworks-piecewise", models.SPLITTING_OPS),
    "FULL": ("pieceworks-full", models.SPLITTING_OPS),
    "FULL unsplit": ("pieceworks-full", []),
}
RATIOS = {
    "PIECEWISE / meta-pcg": ("compiled call", "meta-pcg"),
    "compiled call / plan run": ("compiled call", "plan run"),
    "FULL / reduce-overhead": ("FULL", "reduce-overhead"),
    "FULL unsplit / reduce-overhead": ("FULL unsplit", "reduce-overhead"),
}
LAYERS, REPS = 12, 200  # ToyLlama's layers; samples per variant and batch (after 20 warm-up calls)
PARTS = ("plan run", "graph replays", "splitting ops")  # not checked against eager: they return graph buffers


def _error(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(exc)).strip()


def _build_all(
    model: Any, make: Any, batches: list[int], only: list[str], report: dict[str, Any]
) -> dict[str, Any]:
    """The variants `only` names ("pieceworks": `VARIANTS`), built from the harness registry, reduce-overhead
    last (it resets Dynamo); their build seconds, skip reasons and failures go to `report`."""
    from ..adapters import resolve

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
                built[variant] = impl.build(
                    model, make, sizes if impl.capabilities.padding else batches, splitting_ops
                )
                report["build_s"][variant] = time.perf_counter() - start
                why = f"{report['build_s'][variant]:.1f} s"
            else:
                report["skipped"][variant] = why
        except Exception as exc:  # noqa: BLE001 - recorded; the other variants go on
            why = report["errors"][f"build {variant}"] = _error(exc)
        print(f"  build {variant}: {why}", flush=True)
    return built


def _row(
    built: dict[str, Any], model: Any, inputs: tuple, batch: int, rounds: int, report: dict[str, Any]
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """One batch: the variants (PIECEWISE as its call and `PARTS`), each called once and checked against eager
    (one that fails is recorded and left out), then timed side by side. Returns the row (None where the timing
    failed: recorded) and the callables timed."""
    variants: dict[str, Callable[..., Any]] = {  # each called without arguments (a lambda binding its fn)
        ("compiled call" if v == "PIECEWISE" else v): (lambda fn=b.fn: fn(*inputs)) for v, b in built.items()
    }
    pieces = None
    if "PIECEWISE" in built:
        compiled = built["PIECEWISE"].fn
        try:
            _, work = record(compiled, inputs)
            parts = {
                "plan run": replay_run(compiled, batch),
                "graph replays": in_order([w.run for w in work if w.graph_replay]),
                "splitting ops": in_order([w.run for w in work if not w.graph_replay]),  # eager steps
            }
            variants, pieces = (
                {"compiled call": variants.pop("compiled call"), **parts, **variants},
                len(work),
            )
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
    row = {
        "us": us,
        "pieces": pieces,
        "ratios": {
            label: ratio_over_rounds(us[a], us[b]) if a in us and b in us else None
            for label, (a, b) in RATIOS.items()
        },
    }
    return row, variants


def _measure_dtype(dtype: str, args: argparse.Namespace) -> dict[str, Any]:
    """One dtype's part of the report: builds, skips, errors, a row per batch and the call profile."""
    torch.manual_seed(0)
    config = models.ToyLlamaConfig(num_layers=LAYERS)
    model = models.ToyLlama(config).cuda().to(getattr(torch, dtype))
    batches = [int(b) for b in args.batches.split(",")]

    def make(b: int) -> tuple:
        return models.toy_llama_inputs(b, config, "cuda", seed=b)

    report: dict[str, Any] = {"skipped": {}, "errors": {}, "build_s": {}, "batches": {}}
    with torch.no_grad():
        built = _build_all(model, make, batches, args.only.split(","), report)
        for batch in batches:
            row, variants = _row(built, model, make(batch), batch, args.rounds, report)
            if row is None:
                continue
            report["batches"][str(batch)] = row
            print(
                f"  batch {batch:>4}: "
                + "  ".join(f"{k} {v['median_us']:.1f} us" for k, v in row["us"].items()),
                flush=True,
            )
            if {"compiled call", "plan run"} <= row["us"].keys() and "call_profile" not in report:
                report["call_profile"] = _call_profile(batch, variants["compiled call"], variants["plan run"])
    return report


def _call_profile(batch: int, call: Any, plan: Any, calls: int = 100) -> dict[str, Any]:
    """Where the compiled call's host time goes beyond its plan run: `calls` of each under cProfile, and the
    functions whose own time the call adds (µs and calls per call, most first, at most 8)."""
    profiles = {
        name: host_profile(functools.partial(lambda fn: [fn() for _ in range(calls)], fn), top=None)
        for name, fn in (("compiled call", call), ("plan run", plan))
    }
    plan_own = {r["function"]: r["tottime_s"] for r in profiles["plan run"]["top"]}
    added = [
        {
            "function": r["function"],
            "us_per_call": 1e6 * (r["tottime_s"] - plan_own.get(r["function"], 0.0)) / calls,
            "calls_per_call": r["calls"] / calls,
        }
        for r in profiles["compiled call"]["top"]
    ]
    added = sorted((a for a in added if a["us_per_call"] > 0), key=lambda a: -a["us_per_call"])
    return {
        "batch": batch,
        "calls": calls,
        "seconds": {k: p["seconds"] for k, p in profiles.items()},
        "added": added[:8],
    }


def _measure_to(out: str, dtype: str, args: argparse.Namespace) -> None:
    faulthandler.enable(all_threads=True)  # a fatal signal prints the Python stack
    with open(out, "w") as f:
        json.dump(_measure_dtype(dtype, args), f)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    """The side-by-side run (see the module's docstring): each dtype in a spawned process; returns the
    report."""
    parser = argparse.ArgumentParser(
        description="Side-by-side latency of PIECEWISE's parts and its peers (CUDA)"
    )
    parser.add_argument("--batches", default="1,8,64,256")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--rounds", type=int, default=10, help="rounds of interleaved timing (order rotated)")
    parser.add_argument(
        "--only",
        default="pieceworks,meta-pcg,reduce-overhead",
        help="comma-separated: pieceworks (PIECEWISE, FULL, FULL unsplit) and harness implementations",
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("the side-by-side run needs CUDA: torch sees no CUDA device")
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "model": f"ToyLlama layers={LAYERS}",
        "reps": REPS,
        "rounds": args.rounds,
        "commit": code_commit(),
        "dtypes": {},
    }
    print(f"{report['device']} | torch {report['torch']} | {report['model']} | {report['date']}", flush=True)
    with (
        tempfile.TemporaryDirectory(prefix="pieceworks-breakdown-", ignore_cleanup_errors=True) as work,
        mock.patch.dict(os.environ, {"PIECEWORKS_CACHE_DIR": os.path.join(work, "cache")}),
    ):  # cold, shared
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
