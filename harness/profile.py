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

__all__ = ["kernel_profile", "kernel_kind"]

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
    "share"}]}`; `share` is of all kernel time. Names are cut to 120 characters.
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
    }
