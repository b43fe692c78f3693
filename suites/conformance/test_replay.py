"""Replay correctness: the sweep and drawn batch sequences (plan.py) give eager's outputs, whatever earlier
calls left in padding rows.

- replay-matches-eager (every implementation): before each call, a call of the largest capture size with every
  row poisoned (NaN, +inf, -inf in turn) fills whatever static buffers the implementation keeps; the real call
  of any size (captured, between captured sizes, above the largest) must still give eager's outputs, and the
  closed form where the model has one.
- poison-stays-in-its-rows (implementations that pad): every other call has every other row poisoned; every
  output equals eager's on the same inputs (poisoned rows NaN/inf in both, the others untouched): padding
  never mixes rows.
"""

from __future__ import annotations

import pytest
import torch

from .cases import POISONS
from .checks import assert_same, clone, main_tensor
from .plan import serve


@pytest.mark.conformance("replay-matches-eager")
def test_replay_matches_eager_for_any_batch_sequence(request, subject, served, device, plan):
    model, built = served
    case = subject.case
    top = max(plan.capture_sizes)

    def step(i: int, batch: int) -> None:
        built(*case.poison(case.inputs(top, 500 + i, device), slice(None), POISONS[i % len(POISONS)]))
        args = case.inputs(batch, 1000 + i, device)
        expected = model(*clone(args))
        got = built(*args)
        assert_same(got, expected)
        if case.closed_form is not None:
            torch.testing.assert_close(
                main_tensor(got),
                case.closed_form(args),
                rtol=1e-4,
                atol=1e-3,
                msg=lambda m: f"against the closed form: {m}",
            )

    serve(plan, step, request.function.__name__)


@pytest.mark.conformance("poison-stays-in-its-rows")
def test_poisoned_rows_never_reach_the_rows_of_later_calls(request, subject, served, device, plan):
    model, built = served
    case = subject.case

    def step(i: int, batch: int) -> None:
        args = case.inputs(batch, 2000 + i, device)
        poison = None if i % 2 else POISONS[i // 2 % len(POISONS)]
        if poison is not None:
            args = case.poison(args, slice(None, None, 2), poison)
        expected = model(*clone(args))
        assert_same(built(*args), expected, f"output (every other row {poison})" if poison else "output")

    serve(plan, step, request.function.__name__)
