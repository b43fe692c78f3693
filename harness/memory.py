"""GPU memory readings: bytes in one graph pool, allocator and device-wide deltas."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["pool_bytes", "memory_state"]


def pool_bytes(pool: Any) -> int:
    """Bytes of the caching allocator's segments that belong to graph pool `pool` (a graph_pool_handle)."""
    wanted = tuple(pool)
    return sum(s["total_size"] for s in torch.cuda.memory_snapshot() if tuple(s.get("segment_pool_id", ())) == wanted)


def memory_state() -> dict[str, int]:
    """Allocator reserved/allocated bytes and the device's used bytes (all processes), after a synchronize."""
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    return {
        "reserved": torch.cuda.memory_reserved(),
        "allocated": torch.cuda.memory_allocated(),
        "device_used": total - free,
    }
