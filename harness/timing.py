"""GPU timing: CUDA events around each call, after warm-up; report medians (and quartiles for the spread)."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["cuda_time_us"]


def cuda_time_us(fn: Callable[[], Any], warmup: int = 20, reps: int = 200) -> dict[str, float]:
    """Time `fn()` on the current stream: one event pair per call, `warmup` untimed calls first.

    Returns microseconds: median, p25, p75. Events measure device time from the first launch of the call to the
    last kernel's end, so host overhead counts only where it leaves the GPU idle between kernels.
    """
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for start, end in zip(starts, ends):
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) * 1000.0 for s, e in zip(starts, ends))
    q = statistics.quantiles(times, n=4)
    return {"median_us": statistics.median(times), "p25_us": q[0], "p75_us": q[2]}
