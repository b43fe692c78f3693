"""Latency, capture time and pool memory of piecewise CUDA graphs on ToyLlama, in one run, as ratios.

`python -m pieceworks.harness.measure_cudagraphs --out results/x.json` (needs CUDA) times, at each batch size:
eager, `torch.compile(mode="reduce-overhead")`, and pieceworks in modes NONE, PIECEWISE and FULL (Inductor), with
CUDA events after warm-up (medians), and reports every variant as a ratio to reduce-overhead measured in the same
process. It also records the capture phase (51 sizes <= 512 by default: seconds, MiB) and the pool bytes of all
sizes against a model that captured only the largest size. Every variant's output is checked against eager.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import tempfile
from typing import Any

import torch

import pieceworks
from pieceworks import CompilationConfig, CUDAGraphMode, default_capture_sizes

from . import models
from .memory import pool_bytes
from .timing import cuda_time_us


def _pieceworks(
    model: torch.nn.Module, mode: CUDAGraphMode, sizes: list[int], cache: str, compile_sizes: list[int] = ()
) -> Any:
    config = CompilationConfig(splitting_ops=models.SPLITTING_OPS, cudagraph_mode=mode,
                               cudagraph_capture_sizes=sizes, cache_dir=cache, compile_sizes=list(compile_sizes))
    compiled = pieceworks.compile(model, config)
    compiled(*models.toy_llama_inputs(3, model.config, "cuda"))
    return compiled


def _breakdown(piecewise: Any, config: models.ToyLlamaConfig, reps: int) -> dict[str, float]:
    """Where PIECEWISE time goes at batch 1: the eager splitting ops alone, and the graph replays alone."""
    h = config.hidden_size
    q, k, v, out = (torch.randn(1, h, device="cuda") for _ in range(4))
    attention = torch.ops.silly.attention
    layers = config.num_layers
    graphs = piecewise.runtime.replays[1].graphs  # the PIECEWISE plan of batch 1, in replay order
    return {
        f"{layers} splitting ops, eager": cuda_time_us(
            lambda: [attention(q, k, v, out) for _ in range(layers)], reps=reps)["median_us"],
        f"{len(graphs)} piece graph replays, back to back": cuda_time_us(
            lambda: [g.replay() for g in graphs], reps=reps)["median_us"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--max-size", type=int, default=512)
    parser.add_argument("--batches", default="1,8,64,256")
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit("measure_cudagraphs needs CUDA")

    torch.manual_seed(0)
    config = models.ToyLlamaConfig(num_layers=args.layers)
    model = models.ToyLlama(config).cuda()
    sizes = default_capture_sizes(args.max_size)
    batches = [int(b) for b in args.batches.split(",")]
    cache = tempfile.mkdtemp(prefix="pieceworks-measure-")
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "python": platform.python_version(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "model": f"ToyLlama hidden={config.hidden_size} mlp={config.mlp_size} vocab={config.vocab_size} "
                 f"layers={config.num_layers}",
        "capture_sizes": len(sizes), "reps": args.reps,
    }
    try:
        import triton

        report["triton"] = triton.__version__
    except ImportError:
        report["triton"] = None

    variants: dict[str, Any] = {"eager": model}
    with torch.no_grad():
        variants["reduce-overhead"] = torch.compile(model, mode="reduce-overhead", dynamic=False)
        for mode in (CUDAGraphMode.NONE, CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL):
            compiled = _pieceworks(model, mode, sizes, cache)
            capture = compiled.capture()
            if mode is not CUDAGraphMode.NONE:
                report[f"capture_{mode.name}"] = {**capture, "pool_mib": pool_bytes(compiled.runtime.pool.handle) / 2**20}
            variants[f"pieceworks {mode.name}"] = compiled
        for mode in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL):  # static compiles for the timed sizes
            compiled = _pieceworks(model, mode, sizes, cache, compile_sizes=batches)
            compiled.capture()
            variants[f"pieceworks {mode.name} +sizes"] = compiled
        largest_only = _pieceworks(model, CUDAGraphMode.PIECEWISE, [sizes[-1]], cache)
        largest_only.capture()
        largest_mib = pool_bytes(largest_only.runtime.pool.handle) / 2**20
        del largest_only
        report["pool_largest_size_only_mib"] = largest_mib
        report["pool_ratio_all_sizes_vs_largest"] = report["capture_PIECEWISE"]["pool_mib"] / largest_mib

        latency: dict[str, dict[str, Any]] = {}
        for batch in batches:
            inputs = models.toy_llama_inputs(batch, config, "cuda", seed=batch)
            expected = model(*inputs)
            row = {}
            for name, fn in variants.items():
                for _ in range(3):  # reduce-overhead records its graph on the third call of a shape
                    out = fn(*inputs)
                torch.cuda.synchronize()
                print(f"batch {batch}: {name} ran", flush=True)
                error = float((out.float() - expected).abs().max())
                timing = cuda_time_us(lambda fn=fn: fn(*inputs), reps=args.reps)
                row[name] = {**timing, "max_abs_error_vs_eager": error}
            base = row["reduce-overhead"]["median_us"]
            for entry in row.values():
                entry["ratio_to_reduce_overhead"] = entry["median_us"] / base
            latency[str(batch)] = row
        report["latency"] = latency
        report["breakdown_batch1_us"] = _breakdown(variants["pieceworks PIECEWISE"], config, args.reps)

    print(f"{report['device']} | torch {report['torch']} | {report['model']} | {report['date']}")
    names = list(variants)
    print("batch  " + "  ".join(f"{n:>22}" for n in names))
    print("(+sizes: compile_sizes = the timed batch sizes, i.e. static Inductor compiles for them)")
    for batch, row in latency.items():
        cells = [f"{row[n]['median_us']:9.1f} us ({row[n]['ratio_to_reduce_overhead']:5.2f}x)" for n in names]
        print(f"{batch:>5}  " + "  ".join(f"{c:>22}" for c in cells))
    for mode in ("PIECEWISE", "FULL"):
        c = report[f"capture_{mode}"]
        print(f"capture {mode}: {c['sizes']} sizes, {c['graphs']} graphs, {c['seconds']:.2f} s, pool "
              f"{c['pool_mib']:.1f} MiB, reserved delta {c['reserved_delta_mib']:.1f} MiB, device free delta "
              f"{c['free_delta_mib']:.1f} MiB")
    for what, us in report["breakdown_batch1_us"].items():
        print(f"batch 1 breakdown: {what}: {us:.1f} us")
    print(f"pool, all sizes vs largest only: {report['capture_PIECEWISE']['pool_mib']:.1f} / {largest_mib:.1f} MiB = "
          f"{report['pool_ratio_all_sizes_vs_largest']:.3f}x")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
