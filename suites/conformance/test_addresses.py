"""moved-inputs-never-stale (implementations with CUDA graphs or static buffers): a graph reads the addresses
it captured, and a padded runtime may keep what it copied, so an input the caller moves or rewrites between
calls must give fresh results, or an error naming the input; never the results of the data at an old address
or of a copy.

For every batch the run serves (each once, ascending, then drawn sequences): call with inputs A; then (1) with
A rewritten in place (the same tensors as the call before, new values), (2) with new tensors B while A stays
alive (a new address), (3) with C allocated after A and B were freed (the allocator may hand C their address).
Each result must equal eager's on that call's inputs.
"""

from __future__ import annotations

import pytest

from .checks import assert_same, clone, is_clear_error
from .plan import serve


def _check(model, built, args, where):
    expected = model(*clone(args))
    try:
        got = built(*args)
    except Exception as exc:  # noqa: BLE001 - an error is allowed if it says which input is at fault
        assert is_clear_error(exc), f"{where}: raised {type(exc).__name__}: {exc} (names no input or address)"
        return
    assert_same(got, expected, where)


@pytest.mark.conformance("moved-inputs-never-stale")
def test_inputs_that_move_or_change_give_fresh_results_or_a_clear_error(
    request, subject, served, device, plan
):
    model, built = served
    case = subject.case

    def step(i: int, batch: int) -> None:
        first = case.inputs(batch, 4000 + i, device)
        _check(model, built, first, "first call")
        for a, b in zip(first, case.inputs(batch, 6000 + i, device)):
            a.copy_(b)
        _check(model, built, first, "the first tensors rewritten in place")
        moved = case.inputs(batch, 5000 + i, device)
        _check(model, built, moved, "new tensors, the first ones still alive")
        del first, moved
        reused = case.inputs(batch, 7000 + i, device)
        _check(model, built, reused, "new tensors after the first ones were freed")

    serve(plan, step, request.function.__name__, sweep=plan.batches)
