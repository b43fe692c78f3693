"""Timing: CUDA events for GPU work, a clock for host work; medians with quartiles for the spread.

Never a bare host clock around asynchronous GPU work: `cuda_time_us` records CUDA events around each call,
`host_time_us` times synchronous (CPU) work, and `synchronized_clock` is a timer for tools that take one
(pytest-benchmark's `timer=`): it waits for the GPU before it reads the clock.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["cuda_time_us", "interleaved_cuda_time_us", "ratio_over_rounds", "host_time_us", "summary_us",
           "synchronized_clock"]


def summary_us(times_us: list[float]) -> dict[str, float]:
    """Median, quartiles and interquartile range of `times_us` (at least two values)."""
    q = statistics.quantiles(times_us, n=4)
    return {"median_us": statistics.median(times_us), "p25_us": q[0], "p75_us": q[2], "iqr_us": q[2] - q[0]}


def cuda_time_us(fn: Callable[[], Any], warmup: int = 20, reps: int = 200, calls: int = 1) -> dict[str, float]:
    """Time `fn()` on the current stream: one event pair per `calls` back-to-back calls, `warmup` untimed calls first.

    Returns microseconds per call: median, p25, p75, IQR. Events measure device time from the first launch of the
    call to the last kernel's end, so host overhead counts only where it leaves the GPU idle between kernels.
    `calls > 1` amortises the event records and lets one call's host work overlap the previous call's kernels
    (throughput rather than latency).
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    return summary_us(_event_samples_us(fn, reps, calls))


def _event_samples_us(fn: Callable[[], Any], reps: int, calls: int = 1) -> list[float]:
    """`reps` samples of `calls` back-to-back calls of `fn()`, one CUDA event pair each, in µs per call (waits for
    the GPU before reading them)."""
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends):
        start.record()
        for _ in range(calls):
            fn()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1000.0 / calls for s, e in zip(starts, ends)]


def interleaved_cuda_time_us(fns: dict[str, Callable[[], Any]], warmup: int = 20, reps: int = 200,
                             rounds: int = 10) -> dict[str, dict[str, Any]]:
    """Time several callables side by side with CUDA events: `rounds` rounds, each timing every callable for
    `reps // rounds` calls (one event pair per call, two untimed calls first), in an order rotated every round.

    A slow spell of the host or the GPU (another tenant, a clock change) then falls on every callable alike instead
    of on whichever was being timed, which is what makes a ratio of two of them honest. `warmup` untimed calls of
    each callable come first. Returns, per name, the summary of all its samples (`summary_us`) and
    `round_medians_us`, its median in each round (for `ratio_over_rounds`).
    """
    names = list(fns)
    if not names:
        return {}
    per_round = max(2, reps // rounds)  # reps not a multiple of rounds: rounded down
    for name in names:
        for _ in range(warmup):
            fns[name]()
    samples: dict[str, list[float]] = {name: [] for name in names}
    medians: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fns[name]()
            fns[name]()
            times = _event_samples_us(fns[name], per_round)
            samples[name] += times
            medians[name].append(statistics.median(times))
    return {name: {**summary_us(samples[name]), "round_medians_us": medians[name]} for name in names}


def ratio_over_rounds(numerator: dict[str, Any], denominator: dict[str, Any]) -> dict[str, float]:
    """`numerator / denominator` from two entries of one `interleaved_cuda_time_us` run: the median of the per-round
    ratios, with their minimum and maximum (the spread a reader needs before believing a ratio)."""
    ratios = [a / b for a, b in zip(numerator["round_medians_us"], denominator["round_medians_us"])]
    return {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "rounds": len(ratios)}


def host_time_us(fn: Callable[[], Any], warmup: int = 20, reps: int = 50, calls: int = 20) -> dict[str, float]:
    """Time synchronous `fn()` with `time.perf_counter`: `reps` samples of `calls` calls each, per call, in µs."""
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
    """`time.perf_counter()` after the GPU has finished the work queued so far (plain perf_counter without CUDA)."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()
