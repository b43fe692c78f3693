"""Which compiled code and which captured size serve a batch. Pure functions, no torch.

Compile dispatch: the exact compile size if there is one, else the compile range that holds the batch, else an
error naming the batch and the ranges. Padding: the smallest captured size >= the batch, or None above the
largest (such a batch runs without a graph). Both are O(log n) with `bisect`; callers memoise per batch size.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

Range = tuple[int, int]  # a closed compile range (lo, hi)


class BatchSizeError(ValueError):
    """A batch size that no compiled code covers."""


def find_range(ranges: Sequence[Range], batch: int) -> Range | None:
    """The closed range `(lo, hi)` of sorted, disjoint `ranges` that holds `batch`, or None."""
    i = bisect.bisect_left([hi for _, hi in ranges], batch)
    return ranges[i] if i < len(ranges) and ranges[i][0] <= batch <= ranges[i][1] else None


def compile_target(compile_sizes: Sequence[int], ranges: Sequence[Range], batch: int) -> int | Range:
    """The compile size equal to `batch`, else the range holding it; raises `BatchSizeError` otherwise."""
    found = batch if batch in compile_sizes else find_range(ranges, batch)
    if found is None:
        raise BatchSizeError(
            f"batch size {batch} is outside every compile range {list(ranges)}; raise "
            "CompilationConfig.max_num_batched_tokens (or the last compile_ranges endpoint) to serve it"
        )
    return found


def padded_size(captured_sizes: Sequence[int], batch: int) -> int | None:
    """The smallest of the sorted `captured_sizes` that is >= `batch`, or None when `batch` is above them
    all."""
    i = bisect.bisect_left(captured_sizes, batch)
    return captured_sizes[i] if i < len(captured_sizes) else None
