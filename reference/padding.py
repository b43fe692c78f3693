"""Padding: which captured size a batch runs at, the static input buffers it is copied into, and its outputs
cut back to the batch (the caller's side of CUDA-graph replay).

`padded_size`: the smallest captured size >= the batch, or None above the largest (such a batch runs without a
graph); O(log n) with `bisect`.

`StaticInputs` holds one buffer of the largest captured size per tensor argument; batch n reads the slices
`buffer[:n]`, so the address a graph captured never moves. A call of batch b <= n copies the b real rows in
(one copy per argument); rows b..n-1 keep whatever valid rows they held (the first call's rows, repeated, or
rows of an earlier call), never uninitialised memory: a token id there is always a valid index. The model must
treat rows independently (as every batched inference model does), so padded rows cannot change real ones.
Memory: one max-size copy of each input, and the view objects of the sizes seen (`buffer[:n]` per captured
size, `buffer[:b]` per batch size served), made once and reused so that a call slices nothing. Not
thread-safe.

`unpad` cuts an output back to the real rows: exactly the leaves `batched_outputs` marked once from the trace
(outputs whose dim 0 is the batch symbol, in tuples, lists, dicts, namedtuples, mappings such as a Hugging
Face `ModelOutput`, and dataclasses), never a tensor that only happens to have n rows (a weight of size n).
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .values import children, cycle_rows, tree_map


def padded_size(captured_sizes: Sequence[int], batch: int) -> int | None:
    """The smallest of the sorted `captured_sizes` that is >= `batch`, or None when `batch` is above them
    all."""
    i = bisect.bisect_left(captured_sizes, batch)
    return captured_sizes[i] if i < len(captured_sizes) else None


class StaticInputs:
    def __init__(self, example_args: Sequence[Any], max_size: int) -> None:
        # cycle_rows makes new, contiguous tensors (index_select)
        self.buffers = [cycle_rows(a, max_size) if isinstance(a, torch.Tensor) else a for a in example_args]
        self._views: dict[int, list[Any]] = {}

    def views(self, n: int) -> list[Any]:
        """The arguments at batch n: `buffer[:n]` for tensors (memoised views), other values as they are."""
        if n not in self._views:
            self._views[n] = [b[:n] if isinstance(b, torch.Tensor) else b for b in self.buffers]
        return self._views[n]

    def copy_back(self, args: Sequence[Any], batch: int, positions: Sequence[int]) -> None:
        """Copy the first `batch` rows of the buffers at `positions` (arguments the model writes in place)
        back into the caller's `args`."""
        for i in positions:
            args[i].copy_(self.buffers[i][:batch])

    def load(self, args: Sequence[Any], batch: int) -> None:
        """Copy `args` (batch `batch`) into the buffers' first rows (one copy per tensor argument)."""
        for view, a in zip(self.views(batch), args):
            if isinstance(view, torch.Tensor):
                view.copy_(a, non_blocking=True)


# A container output's items and how to rebuild it (`values.children`: tuples, lists, dicts, namedtuples,
# mappings such as a `ModelOutput`, dataclasses), None for a leaf. A name of its own, which `batched_outputs`
# and `unpad` look up at each call. Its result is typed Any: `unpad` calls it only on what marks say is one.
container_items: Callable[[Any], Any] = children


def batched_outputs(output: Any, is_batched: Callable[[Any], bool]) -> Any:
    """Which leaves of `output` (the tracing call's output) `unpad` cuts: True or False for a leaf, a list
    of the items' marks for a container; a subtree with nothing to cut collapses to False, so a call walks
    only what it cuts."""
    found = container_items(output)
    if found is None:
        return bool(is_batched(output))
    masks = [batched_outputs(v, is_batched) for v in found[0]]
    return masks if any(m is not False for m in masks) else False


def unpad(value: Any, batch: int, n: int, batched: Any = None) -> Any:
    """`value` (an output at padded size n) with the leaves marked in `batched` (see `batched_outputs`) cut
    back to the real `batch` rows; the structure and its types are kept. `batched=None` (no trace to tell):
    every tensor whose dim 0 is n, in tuples, lists and dicts. Batch-sized outputs are new view objects on
    every call, also when batch == n: the objects a plan keeps must never reach the caller (a kept output
    would then be the next call's)."""
    if isinstance(batched, bool):  # a leaf's mark
        return value[:batch] if batched else value
    if batched is not None:  # a container's marks
        items, rebuild = container_items(value)
        return rebuild([unpad(v, batch, n, m) for v, m in zip(items, batched)])

    def cut(v: Any) -> Any:  # no marks: every tensor whose dim 0 is n
        return v[:batch] if isinstance(v, torch.Tensor) and v.dim() > 0 and v.shape[0] == n else v

    return tree_map(cut, value)
