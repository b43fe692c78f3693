"""Timing, the one set of primitives every benchmark uses: CUDA events for GPU work, a clock for host work.

Never a bare host clock around asynchronous GPU work. Results are medians with quartiles (`summary_us`);
several callables are timed side by side in rotating rounds (`interleaved_cuda_time_us`, `ratio_over_rounds`).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = [
    "cuda_time_us",
    "interleaved_cuda_time_us",
    "ratio_over_rounds",
    "host_time_us",
    "summary_us",
    "synchronized_clock",
]


def summary_us(times_us: list[float]) -> dict[str, float]:
    """Median, quartiles and interquartile range of `times_us` (at least two values)."""
    q = statistics.quantiles(times_us, n=4)
    return {"median_us": statistics.median(times_us), "p25_us": q[0], "p75_us": q[2], "iqr_us": q[2] - q[0]}


def cuda_time_us(fn: Callable[[], Any], warmup: int = 20, reps: int = 200) -> dict[str, float]:
    """`fn()` timed alone (`interleaved_cuda_time_us` of one callable, one round): `summary_us` of `reps`
    samples, each one call between CUDA events, after `warmup` untimed calls. Device time from the call's
    first launch to its last kernel's end: host overhead counts only where it leaves the GPU idle."""
    found = interleaved_cuda_time_us({"fn": fn}, warmup=warmup, reps=reps, rounds=1)["fn"]
    return {k: v for k, v in found.items() if k != "round_medians_us"}


def event_samples_us(fn: Callable[[], Any], reps: int) -> list[float]:
    """`reps` calls of `fn()`, one CUDA event pair each, in µs (read after waiting for the GPU)."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends)]


def interleaved_cuda_time_us(
    fns: dict[str, Callable[[], Any]], warmup: int = 20, reps: int = 200, rounds: int = 10
) -> dict[str, dict[str, Any]]:
    """Time callables side by side with CUDA events: `warmup` untimed calls of each, then `rounds` rounds,
    each timing every callable for `reps // rounds` calls (at least 2, after two untimed ones), the order
    rotated every round, so a slow spell of the host or GPU falls on all alike. Returns, per name,
    `summary_us` of its samples and `round_medians_us` (its median in each round, for `ratio_over_rounds`).
    """
    names = list(fns)
    if not names:
        return {}
    per_round = max(2, reps // rounds)
    for name in names:
        for _ in range(warmup):
            fns[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    medians: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            fns[name]()
            fns[name]()
            times = event_samples_us(fns[name], per_round)
            samples[name] += times
            medians[name].append(statistics.median(times))
    return {name: {**summary_us(samples[name]), "round_medians_us": medians[name]} for name in names}


def ratio_over_rounds(numerator: dict[str, Any], denominator: dict[str, Any]) -> dict[str, float]:
    """`numerator / denominator` from two entries of one `interleaved_cuda_time_us` run: the median of the
    per-round ratios, with their minimum, maximum and count."""
    ratios = [a / b for a, b in zip(numerator["round_medians_us"], denominator["round_medians_us"])]
    return {
        "median": statistics.median(ratios),
        "min": min(ratios),
        "max": max(ratios),
        "rounds": len(ratios),
    }


def host_time_us(
    fn: Callable[[], Any], warmup: int = 20, reps: int = 50, calls: int = 20
) -> dict[str, float]:
    """Time synchronous `fn()` with `time.perf_counter`: `reps` samples of `calls` calls each, per call, in
    µs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) * 1e6 / calls)
    return summary_us(times)


def synchronized_clock() -> float:
    """`time.perf_counter()` after the GPU has finished the work queued so far (plain perf_counter without
    CUDA)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()
