"""Compile dispatch and padding lookups (pure functions)."""

from __future__ import annotations

import pytest

from pieceworks.dispatch import BatchSizeError, compile_target, find_range, padded_size

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
    assert [padded_size(sizes, b) for b in range(1, 18)] == (
        [1, 2, 4, 4, 8, 8, 8, 8] + [16] * 8 + [None]
    )
