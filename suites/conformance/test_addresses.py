"""moved-inputs-never-stale (implementations with CUDA graphs): a graph reads the addresses it captured, so an input
the caller moves or rewrites between calls must give fresh results, or an error naming the input; never the results
of the data at an old address.

For each batch size (captured, between, above): call with inputs A; then (1) with new tensors B while A stays alive
(a new address), (2) with A rewritten in place (same address, new values), (3) with C allocated after A was freed
(the allocator may hand C A's address). Each result must equal eager's on that call's inputs.
"""

from __future__ import annotations

import pytest

from .checks import BATCHES, assert_same, clone, is_clear_error


def _check(model, built, args, where):
    expected = model(*clone(args))
    try:
        got = built(*args)
    except Exception as exc:  # noqa: BLE001 - an error is allowed if it says which input is at fault
        assert is_clear_error(exc), f"{where}: raised {type(exc).__name__}: {exc} (names no input or address)"
        return
    assert_same(got, expected, where)


@pytest.mark.conformance("moved-inputs-never-stale")
def test_inputs_that_move_or_change_give_fresh_results_or_a_clear_error(subject, served, device):
    model, built = served
    case = subject.case
    for batch in BATCHES:
        first = case.inputs(batch, 4000 + batch, device)
        _check(model, built, first, f"batch {batch}: first call")
        moved = case.inputs(batch, 5000 + batch, device)
        _check(model, built, moved, f"batch {batch}: new tensors, the first ones still alive")
        for a, b in zip(first, case.inputs(batch, 6000 + batch, device)):
            a.copy_(b)
        _check(model, built, first, f"batch {batch}: the first tensors rewritten in place")
        del first, moved
        reused = case.inputs(batch, 7000 + batch, device)
        _check(model, built, reused, f"batch {batch}: new tensors after the first ones were freed")
