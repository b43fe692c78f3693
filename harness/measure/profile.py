"""Profiles, the latency path's options for where time goes: `kernel_profile` (GPU kernels, torch.profiler)
and `host_profile` (host functions, cProfile). A profiler session leaves CUPTI loaded: profile after the last
timing.
"""

from __future__ import annotations

import cProfile
import os
import re
import sysconfig
import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["host_profile", "kernel_profile", "kernels_only_in", "launch_gaps", "own_time_by_owner", "owner"]

_STDLIB = sysconfig.get_paths()["stdlib"]  # the standard library's folder, for `owner`
# cuBLAS(Lt), CUTLASS kernels
_LIBRARY = re.compile(r"gemm|gemv|xmma|cublas|cutlass|nvjet|splitk", re.IGNORECASE)


def kernel_profile(fn: Callable[[], Any], calls: int = 5) -> dict[str, Any]:
    """Profile `calls` calls of `fn()` (CUDA, after one warm-up call; kernels of graph replays where CUPTI
    reports them). Returns `{"device_us_per_call", "library_share" (of kernel time: cuBLAS, cuBLASLt, CUTLASS
    GEMMs and GEMVs), "kernels": {name: [us_per_call, calls_per_call]}}`, every kernel, most time first.
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
        us = event.self_device_time_total
        if us <= 0 or event.key.startswith(("Memcpy", "Memset", "cudaGraph")):
            continue
        entry = kernels.setdefault(event.key, [0.0, 0.0])
        entry[0] += us
        entry[1] += event.count
    total = sum(us for us, _ in kernels.values())
    library = sum(us for name, (us, _) in kernels.items() if _LIBRARY.search(name))
    return {
        "device_us_per_call": total / calls,
        "library_share": library / total if total else 0.0,
        "kernels": {
            name: [us / calls, count / calls]
            for name, (us, count) in sorted(kernels.items(), key=lambda kv: -kv[1][0])
        },
    }


def kernels_only_in(
    first: dict[str, Any], second: dict[str, Any], limit: int = 3
) -> list[tuple[str, float, float]]:
    """At most `limit` kernels `first`'s profile runs and `second`'s does not, most time first: `(name, µs per
    call, launches per call)`; empty where a profile has no `kernels` field."""
    mine, theirs = first.get("kernels") or {}, second.get("kernels")
    only = [(n, us, c) for n, (us, c) in mine.items() if theirs is not None and n not in theirs]
    return sorted(only, key=lambda k: -k[1])[:limit]


def owner(path: str) -> str:
    """Who owns the code of `path`, a profiled function's file: a package of an installation
    (`torch._inductor`, `torch.fx`: torch by its subpackage; `triton`, `sympy`, `pieceworks`: by name),
    "python" (the standard library, the interpreter's `<frozen ...>` modules), "generated" (code written at
    run time: Inductor's output modules, FX's `<eval_with_key>`), "pieceworks" (its source tree, installed
    editable: reference/ and harness/), else "other" (the caller's own code)."""
    parts = path.replace(os.sep, "/").split("/")
    if sites := [i for i, part in enumerate(parts[:-1]) if part in ("site-packages", "dist-packages")]:
        package = parts[sites[-1] + 1 :]
        deep = package[0] == "torch" and len(package) > 2
        return ".".join(package[:2]) if deep else package[0].removesuffix(".py")
    if path.startswith(("<frozen", _STDLIB)):
        return "python"
    if path.startswith("<eval_with_key>") or "/inductor/" in path or "/torchinductor_" in path:
        return "generated"
    return "pieceworks" if "reference" in parts or "harness" in parts else "other"


def own_time_by_owner(stats: dict) -> dict[str, float]:
    """cProfile's own time (`Profile.stats` after `create_stats()`) summed by `owner`, most first; a built-in
    function's (no file of its own) shared among its callers' owners as it was spent under each caller."""
    found: dict[str, float] = {}
    for (path, _, _), (_, _, tottime, _, callers) in stats.items():
        shares = (
            [(key[0], by[2]) for key, by in callers.items()] if path == "~" and callers else [(path, tottime)]
        )
        for caller, spent in shares:
            who = owner(caller)
            found[who] = found.get(who, 0.0) + spent
    return dict(sorted(found.items(), key=lambda kv: -kv[1]))


def host_profile(fn: Callable[[], Any], top: int | None = 8) -> dict[str, Any]:
    """Where `fn()`'s host time goes: one call under cProfile. Returns `seconds` (wall time, profiler overhead
    included), the `top` functions (None: all) by own time: `function` (`dir/file.py:line(name)`, or
    `<built-in method ...>`), `calls`, `tottime_s`, `cumtime_s`; and `owners` (`own_time_by_owner`: own time
    is exact where cumulative time is not, a frame Dynamo's hooks hide having none). Host time only, never
    GPU time."""
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    try:
        fn()
    finally:
        profiler.disable()
    seconds = time.perf_counter() - start
    rows: list[dict[str, Any]] = []
    profiler.create_stats()  # fills profiler.stats, which pstats.Stats(profiler) would read
    for (path, line, name), (_, calls, tottime, cumtime, _) in profiler.stats.items():
        where = name if path == "~" else f"{os.path.join(*path.split(os.sep)[-2:])}:{line}({name})"
        rows.append({"function": where, "calls": calls, "tottime_s": tottime, "cumtime_s": cumtime})
    rows.sort(key=lambda r: -r["tottime_s"])
    owners = own_time_by_owner(profiler.stats)
    return {"seconds": seconds, "top": rows[:top], "owners": owners}


def launch_gaps(fn: Callable[[], Any], ops: tuple[str, ...], calls: int = 20) -> dict[str, float]:
    """The host time of `fn()` (a forward) spent outside its CUDA-graph launches and the ops named in `ops`
    (its splitting ops, whatever they launch): the runtime's own host time, launch to launch. Each call under
    the profiler's CPU activity: the call's span less the union of those events inside it, a sum of gaps that
    cannot go below zero (the profiler's own cost per event included: an upper bound). Returns, per call, the
    medians of `call_us`, `gaps_us` and `launches` (graph launches plus ops), and `gap_us_per_launch`."""
    import statistics

    from torch.profiler import ProfilerActivity, profile, record_function

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            with record_function("launch_gaps.call"):
                fn()
        torch.cuda.synchronize()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CPU]
    spans = [e.time_range for e in events if e.name == "launch_gaps.call"]
    work = sorted(
        (e.time_range for e in events if e.name == "cudaGraphLaunch" or e.name in ops), key=lambda w: w.start
    )
    rows = []
    for span in spans:
        inside = [
            (max(w.start, span.start), min(w.end, span.end))
            for w in work
            if w.end > span.start and w.start < span.end
        ]
        covered, reach = 0.0, span.start
        for start, end in inside:  # the union of the intervals, sorted by start
            covered += max(0.0, end - max(start, reach))
            reach = max(reach, end)
        rows.append((span.end - span.start, span.end - span.start - covered, len(inside)))
    call, gaps, launches = (statistics.median(column) for column in zip(*rows))
    return {
        "call_us": call,
        "gaps_us": gaps,
        "launches": launches,
        "gap_us_per_launch": gaps / max(launches, 1),
    }
