"""Compile dispatch and padding lookups (pure functions)."""

from __future__ import annotations

import pytest

from pieceworks.padding import padded_size
from pieceworks.piece import BatchSizeError, compile_target, find_range

RANGES = [(1, 8), (9, 64), (65, 512)]


def test_exact_size_wins_over_range():
    assert compile_target([4, 100], RANGES, 4) == 4
    assert compile_target([4, 100], RANGES, 5) == (1, 8)
    assert compile_target([4, 100], RANGES, 100) == 100
    assert compile_target([], RANGES, 9) == (9, 64)
    assert compile_target([], RANGES, 512) == (65, 512)


def test_batch_outside_ranges_names_batch_and_ranges():
    with pytest.raises(BatchSizeError) as info:
        compile_target([], RANGES, 513)
    assert "513" in str(info.value) and "(65, 512)" in str(info.value)
    assert find_range(RANGES, 0) is None


def test_padding_picks_smallest_captured_size_at_least_batch():
    sizes = [1, 2, 4, 8, 16]
    assert [padded_size(sizes, b) for b in range(1, 18)] == ([1, 2, 4, 4, 8, 8, 8, 8] + [16] * 8 + [None])


def test_static_inputs_hold_each_call_in_place_and_keep_earlier_rows_as_padding():
    """`StaticInputs.load` over a sequence of batch sizes (each seen more than once): the first `batch` rows
    of every tensor buffer are the call's, the rows after them are what an earlier call (or the first) left
    there, the views of a padded size always sit at the buffers' addresses, and plain values pass through."""
    import random

    import torch

    from pieceworks.padding import StaticInputs

    sizes, largest = [1, 2, 4, 8, 16], 16
    example = [torch.arange(3) * 10, 2.5, torch.arange(3 * 2, dtype=torch.float32).reshape(3, 2)]
    static = StaticInputs(example, largest)
    expected = [b.clone() if isinstance(b, torch.Tensor) else b for b in static.buffers]
    addresses = [b.data_ptr() if isinstance(b, torch.Tensor) else None for b in static.buffers]
    rng = random.Random(0)
    for step in range(60):
        batch = rng.choice([1, 3, 4, 7, 8, 13, 16])
        n = padded_size(sizes, batch)
        args = [torch.randint(0, 100, (batch,)) + step, 2.5, torch.randn(batch, 2)]
        static.load(args, batch)
        views = static.views(n)
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                expected[i][:batch] = a
        for view, want, buffer, address in zip(views, expected, static.buffers, addresses):
            if isinstance(want, torch.Tensor):
                assert view.shape[0] == n and view.data_ptr() == address
                torch.testing.assert_close(buffer, want, rtol=0, atol=0)
            else:
                assert view == want
