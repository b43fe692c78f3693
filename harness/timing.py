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

__all__ = ["cuda_time_us", "host_time_us", "summary_us", "synchronized_clock"]


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
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends):
        start.record()
        for _ in range(calls):
            fn()
        end.record()
    torch.cuda.synchronize()
    return summary_us([s.elapsed_time(e) * 1000.0 / calls for s, e in zip(starts, ends)])


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
