"""GPU memory readings, each seeing something the others do not:
- `pool_bytes(pool)`: the caching allocator's segments of one graph pool (what capture costs, per pool);
- `memory_state()["reserved"]`: everything the allocator holds (all pools, the default pool, workspaces);
- `own_memory(pool)`: this process's own allocations (allocator statistics and one pool's bytes), which
  nothing another process does can move: what a test of "no growth" compares;
- `memory_state()["nvml_used"]`: NVML's used bytes for the whole device: every process on the GPU, the CUDA
  context, and driver-side memory the allocator never sees (CUDA-graph executables, about a quarter MiB per
  graph); None when NVML is missing or cannot see the device (`nvml_status()` says why). `device_used` is the
  same device-wide view through `cudaMemGetInfo`. Snapshots only, no peaks.
"""

from __future__ import annotations

from typing import Any

import torch

from pieceworks.core import pool_bytes

__all__ = ["pool_bytes", "memory_state", "nvml_status", "own_memory"]

_nvml: dict[Any, Any] = {}  # per process: NVML handles by device index, or "reason": why NVML is unusable


def _nvml_handle(device: int) -> Any:
    """NVML's handle for torch's CUDA device `device`, matched by UUID (CUDA_VISIBLE_DEVICES may renumber);
    None with `_nvml["reason"]` set when NVML cannot read it."""
    if device not in _nvml and "reason" not in _nvml:
        try:
            import pynvml

            pynvml.nvmlInit()
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(
                    "GPU-" + str(torch.cuda.get_device_properties(device).uuid)
                )
            except pynvml.NVMLError:
                if pynvml.nvmlDeviceGetCount() != 1 or torch.cuda.device_count() != 1:
                    raise
                handle = pynvml.nvmlDeviceGetHandleByIndex(0)  # one GPU each way: the same one
            pynvml.nvmlDeviceGetMemoryInfo(handle)
            _nvml[device] = handle
        except ImportError:
            _nvml["reason"] = "nvidia-ml-py is not installed (pip install 'pieceworks[bench]')"
        except Exception as exc:  # noqa: BLE001 - driver mismatch, sandbox: say so, never crash
            _nvml["reason"] = f"NVML cannot read device {device}: {type(exc).__name__}: {exc}"
    return _nvml.get(device)


def nvml_status(device: int | None = None) -> str:
    """What the NVML reading covers on this machine, or why there is none."""
    if not torch.cuda.is_available():
        return "no CUDA device: no NVML reading"
    if _nvml_handle(torch.cuda.current_device() if device is None else device) is None:
        return _nvml["reason"]
    import pynvml

    return (
        f"NVML device-wide used bytes (driver {pynvml.nvmlSystemGetDriverVersion()}): every process on the "
        "GPU, the CUDA context and driver-side graph memory; snapshots only"
    )


def _nvml_used() -> int | None:
    handle = _nvml_handle(torch.cuda.current_device())
    if handle is None:
        return None
    import pynvml

    return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)


def memory_state() -> dict[str, int | None]:
    """Allocator reserved/allocated bytes, device used bytes (cudaMemGetInfo) and NVML used bytes, after a
    sync."""
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return {
        "reserved": torch.cuda.memory_reserved(),
        "allocated": torch.cuda.memory_allocated(),
        "device_used": total - free,
        "nvml_used": _nvml_used(),
    }


def own_memory(pool: Any = None) -> dict[str, int]:
    """This process's device memory, after a sync: the caching allocator's allocated and reserved bytes and
    live blocks, and the bytes of graph pool `pool` (0 for None). Unlike `nvml_used` and `device_used`,
    another process on the GPU never moves it."""
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    return {
        "allocated": stats.get("allocated_bytes.all.current", 0),
        "reserved": stats.get("reserved_bytes.all.current", 0),
        "blocks": stats.get("active.all.current", 0),
        "pool": pool_bytes(pool),
    }
