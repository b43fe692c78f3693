"""Which GPU kernels a forward spends its time in: one torch.profiler look per (implementation, batch size).

`kernel_profile(fn)` runs `fn()` a few times under `torch.profiler` (CUDA activity only, after a warm-up call) and
returns the kernels by device time per call, each classed as a library kernel (cuBLAS/cuBLASLt/CUTLASS GEMMs and
GEMVs), a Triton kernel (Inductor's) or an ATen kernel. The benchmark report uses it to say where a library kernel,
not the implementation under test, dominates a batch size (e.g. cuBLAS's fp32 xmma GEMM at batch 8 on an H100).
Kernels launched from CUDA-graph replays are included where CUPTI reports them (it does on recent drivers).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["kernel_profile", "kernel_kind", "kernels_only_in", "host_profile"]

_LIBRARY = re.compile(r"gemm|gemv|xmma|cublas|cutlass|nvjet|cutlass|splitk", re.IGNORECASE)


def kernel_kind(name: str) -> str:
    """"library" (cuBLAS & co.), "triton", "aten" or "other", from a kernel's name."""
    if _LIBRARY.search(name):
        return "library"
    if name.startswith("triton") or "triton_" in name:
        return "triton"
    if "at::native" in name or "at::" in name:
        return "aten"
    return "other"


def _device_us(event: Any) -> float:
    for attr in ("self_device_time_total", "self_cuda_time_total", "device_time_total", "cuda_time_total"):
        value = getattr(event, attr, None)
        if value:
            return float(value)
    return 0.0


def kernel_profile(fn: Callable[[], Any], calls: int = 5, top: int = 5) -> dict[str, Any]:
    """Profile `calls` calls of `fn()` (CUDA); return device µs per call and the `top` kernels by time per call.

    Result: `{"device_us_per_call", "library_share", "top": [{"name", "kind", "us_per_call", "calls_per_call",
    "share"}], "kernels": {name: [us_per_call, calls_per_call]}}`: `share` is of all kernel time; `kernels` lists
    every kernel (for telling two profiles apart: `kernels_only_in`). Names are cut to 120 characters in `top`,
    whole in `kernels`.
    """
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = {}
    for event in prof.key_averages():
        us = _device_us(event)
        if us <= 0 or event.key.startswith(("Memcpy", "Memset", "cudaGraph")):
            continue
        entry = kernels.setdefault(event.key, [0.0, 0.0])
        entry[0] += us
        entry[1] += event.count
    total = sum(us for us, _ in kernels.values())
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][0])
    library = sum(us for name, (us, _) in kernels.items() if kernel_kind(name) == "library")
    return {
        "device_us_per_call": total / calls,
        "library_share": library / total if total else 0.0,
        "top": [
            {"name": name[:120], "kind": kernel_kind(name), "us_per_call": us / calls,
             "calls_per_call": count / calls, "share": us / total if total else 0.0}
            for name, (us, count) in ranked[:top]
        ],
        "kernels": {name: [us / calls, count / calls] for name, (us, count) in ranked},
    }


def kernels_only_in(first: dict[str, Any], second: dict[str, Any], limit: int = 3) -> list[tuple[str, float, float]]:
    """The kernels `first`'s profile runs and `second`'s does not (by name), most time first: `(name, µs per call
    of the profiled function, summed over that kernel's launches; launches per call)`, at most `limit`. Empty when
    either profile predates the `kernels` field."""
    mine, theirs = first.get("kernels"), second.get("kernels")
    if not mine or theirs is None:
        return []
    only = sorted(((n, us, c) for n, (us, c) in mine.items() if n not in theirs), key=lambda k: -k[1])
    return only[:limit]


def main(argv: list[str] | None = None) -> int:
    """Time, then profile, implementations side by side in one process (CUDA): the numbers behind a latency ratio.

    `python -m pieceworks.harness.profile --impl pieceworks-full --impl reduce-overhead [--model toy_llama|silly]
    [--layers 12] [--dtype bfloat16] [--batches 8 64 512] [--out FILE.json]`. Each implementation is built once
    (padding ones capture vLLM's sizes up to the largest batch, the others the batches themselves), every batch is
    timed (CUDA events, median and IQR of 200 calls after 20), and only then profiled (a profiler session leaves
    CUPTI loaded, so no timing follows one). Prints per batch: each implementation's median, its ratio to the first
    implementation, its kernel µs per forward, GPU busy share and top kernels.
    """
    import argparse
    import json

    from pieceworks import default_capture_sizes

    from . import models
    from .implementations import load_user_implementations, resolve
    from .timing import cuda_time_us

    parser = argparse.ArgumentParser(description=main.__doc__.splitlines()[0])
    parser.add_argument("--impl", action="append", required=True, help="implementation name or module:Adapter")
    parser.add_argument("--model", choices=["toy_llama", "silly"], default="toy_llama")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 64, 512])
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs CUDA: torch sees no CUDA device")
    load_user_implementations()
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    if args.model == "silly":
        model = models.SillyModel().cuda().to(dtype)
        make_inputs = lambda b: (torch.randn(b, generator=torch.Generator().manual_seed(b)).to("cuda", dtype),)  # noqa: E731
    else:
        config = models.ToyLlamaConfig(num_layers=args.layers)
        model = models.ToyLlama(config).to("cuda", dtype)
        make_inputs = lambda b: models.toy_llama_inputs(b, config, device="cuda", seed=b)  # noqa: E731
    batches = sorted(set(args.batches))
    import datetime
    import os

    built, report = {}, {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "model": args.model,
                         "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                         "commit": os.environ.get("PIECEWORKS_COMMIT"),  # the tree measured, where the caller knows it
                         "layers": args.layers, "dtype": args.dtype, "batches": batches, "timings": {}, "profiles": {}}
    with torch.no_grad():
        for name in args.impl:
            impl = resolve(name)
            sizes = default_capture_sizes(max(batches)) if impl.capabilities.padding else batches
            built[name] = impl.build(model, make_inputs, sizes, models.SPLITTING_OPS)
            for b in batches:
                inputs = make_inputs(b)
                report["timings"][f"{name}|{b}"] = cuda_time_us(lambda: built[name](*inputs))
        for name in args.impl:
            for b in batches:
                inputs = make_inputs(b)
                report["profiles"][f"{name}|{b}"] = kernel_profile(lambda: built[name](*inputs), calls=3)
    first = args.impl[0]
    for b in batches:
        base = report["timings"][f"{first}|{b}"]["median_us"]
        for name in args.impl:
            t, p = report["timings"][f"{name}|{b}"], report["profiles"][f"{name}|{b}"]
            tops = "; ".join(f"{k['name'][:60]} {k['us_per_call']:.1f} us x{k['calls_per_call']:.0f}" for k in p["top"][:3])
            print(f"batch {b:4d} {name:24s} {t['median_us']:8.1f} us (IQR {t['iqr_us']:.1f}) "
                  f"{t['median_us'] / base:5.2f}x {first} | kernels {p['device_us_per_call']:.0f} us "
                  f"({p['device_us_per_call'] / t['median_us']:.0%} busy) | {tops}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    return 0


def host_profile(fn: Callable[[], Any], top: int | None = 8) -> dict[str, Any]:
    """Where `fn()`'s host time goes: one call under cProfile. Returns `seconds` (the call's wall time, profiler
    overhead included) and the `top` functions (None: all) by own time (`tottime_s`, with `cumtime_s` and `calls`), named
    `file:line(function)` with the file's last two path parts, or `<built-in method ...>` for C functions (a CUDA
    graph's `capture_end`, say). For phases whose cost is host work, such as a capture phase; not for GPU time."""
    import cProfile
    import os
    import pstats
    import time

    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    try:
        fn()
    finally:
        profiler.disable()
    seconds = time.perf_counter() - start
    rows = []
    for (path, line, name), (_, calls, tottime, cumtime, _) in pstats.Stats(profiler).stats.items():
        where = name if path == "~" else f"{os.path.join(*path.split(os.sep)[-2:])}:{line}({name})"
        rows.append({"function": where, "calls": calls, "tottime_s": tottime, "cumtime_s": cumtime})
    rows.sort(key=lambda r: -r["tottime_s"])
    return {"seconds": seconds, "top": rows[:top]}


if __name__ == "__main__":
    import sys

    sys.exit(main())
