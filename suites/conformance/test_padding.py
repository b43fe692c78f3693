"""outputs-cut-to-batch (implementations that pad): a call of b rows, padded to a captured size, returns the
model's output structure (tuples, lists, dicts as eager returns them) with every batched tensor cut back to b
rows, and eager's values; over the sweep (every batch up to just above the largest size, ascending and
descending) and drawn sequences."""

from __future__ import annotations

import pytest

from .checks import assert_same, clone
from .plan import serve


@pytest.mark.conformance("outputs-cut-to-batch")
def test_padded_outputs_are_cut_back_in_the_models_structure(request, subject, served, device, plan):
    model, built = served
    case = subject.case

    def step(i: int, batch: int) -> None:
        args = case.inputs(batch, 3000 + i, device)
        expected = model(*clone(args))
        assert_same(built(*args), expected)

    serve(plan, step, request.function.__name__)
