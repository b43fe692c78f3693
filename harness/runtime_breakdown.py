"""Where a PIECEWISE forward's time goes, next to its peers, on ToyLlama: one process, CUDA events, ratios.

`python -m pieceworks.harness.runtime_breakdown [--out results/runtime_breakdown.json]` (CUDA only; about 2-4 min on
an H100 for 12 layers, two dtypes, four batch sizes). For each dtype and batch it times, with CUDA events after
warm-up (median, p25, p75 in µs):
- `compiled call`: `CompiledModel.__call__` in PIECEWISE mode (argument checks, static copy, plan, cut back);
- `plan run`: the replay plan of the padded size alone, on the static buffers (no checks, no copies);
- `graph replays`: the plan's piece graphs replayed back to back; `splitting ops`: its eager steps alone;
- `FULL`: pieceworks FULL; `reduce-overhead`: `torch.compile(mode="reduce-overhead")`; `meta-pcg`: Meta's
  piecewise-cuda-graphs (skipped, with the reason, when the package or its harness adapter is absent);
and derives: PIECEWISE / meta-pcg, compiled call / plan run, FULL / reduce-overhead, and host overhead per piece =
(compiled call - graph replays - splitting ops) / pieces, negative where host work overlaps GPU work. Every variant's
output is compared with eager (max abs error), so a fast wrong answer shows.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
import time
from typing import Any

import torch

import pieceworks
from pieceworks import CompilationConfig, CUDAGraphMode, default_capture_sizes

from . import models
from .timing import cuda_time_us


def _pieceworks(model: torch.nn.Module, mode: CUDAGraphMode, sizes: list[int], cache: str, make: Any) -> Any:
    config = CompilationConfig(splitting_ops=models.SPLITTING_OPS, cudagraph_mode=mode, cudagraph_capture_sizes=sizes,
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
    runtime = compiled.runtime
    n = min(s for s in runtime.replays if s >= batch)
    plan = runtime.replays[n]
    flat = runtime.binder.inputs(runtime.static.views(n), n)
    slots = [None] * plan.num_slots
    eager = [plan.steps[i] for i in plan.eager_steps]
    graphs = plan.graphs

    def replays() -> None:
        for g in graphs:
            g.replay()

    def splitting() -> None:
        for step in eager:
            step(flat, slots)

    plan.run(flat, ())  # fills the slots the eager steps may read
    return {"plan": lambda: plan.run(flat, ()), "replays": replays, "splitting": splitting,
            "pieces": len(graphs) + len(eager)}


def _measure_dtype(dtype: torch.dtype, args: argparse.Namespace, cache: str) -> dict[str, Any]:
    torch.manual_seed(0)
    config = models.ToyLlamaConfig(num_layers=args.layers)
    model = models.ToyLlama(config).cuda().to(dtype)
    batches = [int(b) for b in args.batches.split(",")]
    sizes = default_capture_sizes(max(batches))
    make = lambda b: models.toy_llama_inputs(b, config, "cuda", seed=b)  # noqa: E731
    start = time.perf_counter()
    with torch.no_grad():
        piecewise = _pieceworks(model, CUDAGraphMode.PIECEWISE, sizes, cache, make)
        full = _pieceworks(model, CUDAGraphMode.FULL, sizes, cache, make)
        pcg, pcg_skip = _peer("meta-pcg", model, make, sizes)
        reduce_overhead, ro_skip = _peer("reduce-overhead", model, make, batches)  # last: it resets Dynamo
    report: dict[str, Any] = {"build_s": time.perf_counter() - start, "direct_calls": piecewise.runtime.binder
                              is not None, "skipped": {k: v for k, v in [("meta-pcg", pcg_skip),
                                                                         ("reduce-overhead", ro_skip)] if v}}
    rows = {}
    with torch.no_grad():
        for batch in batches:
            inputs = make(batch)
            expected = model(*inputs)
            parts = _plan_parts(piecewise, batch)
            variants = {"compiled call": lambda: piecewise(*inputs), "plan run": parts["plan"],
                        "graph replays": parts["replays"], "splitting ops": parts["splitting"],
                        "FULL": lambda: full(*inputs)}
            if pcg is not None:
                variants["meta-pcg"] = lambda: pcg(*inputs)
            if reduce_overhead is not None:
                variants["reduce-overhead"] = lambda: reduce_overhead(*inputs)
            row: dict[str, Any] = {}
            for name, fn in variants.items():
                row[name] = cuda_time_us(fn, warmup=args.warmup, reps=args.reps)
                if name in ("compiled call", "FULL", "meta-pcg", "reduce-overhead"):
                    out = fn()
                    row[name]["max_abs_error_vs_eager"] = float((out.float() - expected.float()).abs().max())
            med = {k: v["median_us"] for k, v in row.items()}
            ratios = {"PIECEWISE / meta-pcg": med["compiled call"] / med["meta-pcg"] if "meta-pcg" in med else None,
                      "compiled call / plan run": med["compiled call"] / med["plan run"],
                      "FULL / reduce-overhead": (med["FULL"] / med["reduce-overhead"]
                                                 if "reduce-overhead" in med else None)}
            overhead = med["compiled call"] - med["graph replays"] - med["splitting ops"]
            rows[str(batch)] = {"us": row, "ratios": ratios, "pieces": parts["pieces"],
                                "host_overhead_per_piece_us": overhead / parts["pieces"]}
    report["batches"] = rows
    return report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--batches", default="1,8,64,256")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("runtime_breakdown needs CUDA: torch sees no CUDA device")
    cache = tempfile.mkdtemp(prefix="pieceworks-breakdown-")
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": f"ToyLlama layers={args.layers}", "reps": args.reps, "dtypes": {},
    }
    for name in args.dtypes.split(","):
        report["dtypes"][name] = _measure_dtype(getattr(torch, name), args, cache)

    print(f"{report['device']} | torch {report['torch']} | {report['model']} | {report['date']}")
    for dtype, result in report["dtypes"].items():
        print(f"\n{dtype}: built in {result['build_s']:.1f} s, direct calls: {result['direct_calls']}, "
              f"skipped: {result['skipped'] or 'none'}")
        for batch, row in result["batches"].items():
            cells = "  ".join(f"{k} {v['median_us']:.1f} [{v['p25_us']:.1f}-{v['p75_us']:.1f}]"
                              for k, v in row["us"].items())
            ratios = "  ".join(f"{k} {v:.3f}" for k, v in row["ratios"].items() if v is not None)
            print(f"  batch {batch:>4}: {cells}")
            print(f"              {ratios}  host overhead/piece {row['host_overhead_per_piece_us']:.2f} us "
                  f"({row['pieces']} pieces)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
