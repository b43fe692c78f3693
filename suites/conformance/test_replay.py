"""Replay correctness: any batch sequence gives eager's outputs, whatever earlier calls left in padding rows.

- replay-matches-eager (every implementation): before each call, a call of the largest captured size with every row
  poisoned (NaN, +inf, -inf in turn) fills whatever static buffers the implementation keeps; the real call of any
  size (captured, between captured sizes, above the largest) must still give eager's outputs, and the closed form
  where the model has one.
- poison-stays-in-its-rows (implementations that pad): calls with every other row poisoned, interleaved with clean
  calls of any size; every output equals eager's on the same inputs (poisoned rows NaN/inf in both, the others
  untouched): padding never mixes rows.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

from pieceworks.harness import strategies as S

from .cases import POISONS
from .checks import BATCHES, CAPTURE_SIZES, assert_same, clone, main_tensor, tolerances

SETTINGS = S.gpu_settings(fraction=5)
SEQUENCES = st.lists(st.sampled_from(BATCHES), min_size=1, max_size=6)


@pytest.mark.conformance("replay-matches-eager")
@SETTINGS
@given(sequence=SEQUENCES)
@example(sequence=[8, 5, 2, 11, 1, 4])  # captured, between, above: every kind once
def test_replay_matches_eager_for_any_batch_sequence(subject, served, device, sequence):
    model, built = served
    case = subject.case
    top = max(CAPTURE_SIZES)
    for i, batch in enumerate(sequence):
        poison = case.poison(case.inputs(top, 500 + i, device), slice(None), POISONS[i % len(POISONS)])
        built(*poison)
        args = case.inputs(batch, 1000 + i, device)
        expected = model(*clone(args))
        got = built(*args)
        assert_same(got, expected, f"call {i} (batch {batch})")
        if case.closed_form is not None:
            torch.testing.assert_close(main_tensor(got), case.closed_form(args), rtol=1e-4, atol=1e-3,
                                       msg=lambda m: f"call {i} (batch {batch}) against the closed form: {m}")


STEPS = st.lists(st.tuples(st.sampled_from(BATCHES), st.sampled_from([None, *POISONS])), min_size=2, max_size=6)


@pytest.mark.conformance("poison-stays-in-its-rows")
@SETTINGS
@given(steps=STEPS)
@example(steps=[(8, float("nan")), (5, None), (4, float("inf")), (2, None)])
def test_poisoned_rows_never_reach_the_rows_of_later_calls(subject, served, device, steps):
    model, built = served
    case = subject.case
    for i, (batch, poison) in enumerate(steps):
        args = case.inputs(batch, 2000 + i, device)
        if poison is not None:
            args = case.poison(args, slice(None, None, 2), poison)
        expected = model(*clone(args))
        assert_same(built(*args), expected, f"call {i} (batch {batch}, every other row {poison})")
