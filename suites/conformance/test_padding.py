"""outputs-cut-to-batch (implementations that pad): a call of b rows, padded to a captured size, returns the model's
output structure (tuples, lists, dicts as eager returns them) with every batched tensor cut back to b rows, and
eager's values; sizes above the largest captured one too, in ascending and descending order."""

from __future__ import annotations

import pytest

from .checks import BATCHES, assert_same, clone


@pytest.mark.conformance("outputs-cut-to-batch")
def test_padded_outputs_are_cut_back_in_the_models_structure(subject, served, device):
    model, built = served
    case = subject.case
    for i, batch in enumerate(BATCHES + BATCHES[::-1]):
        args = case.inputs(batch, 3000 + i, device)
        expected = model(*clone(args))
        assert_same(built(*args), expected, f"call {i} (batch {batch})")
