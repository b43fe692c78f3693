"""argument-writes-reach-the-caller (models that write their arguments in place: silly-inplace): after every
call of the sweep and of drawn sequences, the caller's arguments hold what eager's call wrote into its own
copy of them, and the outputs are eager's. A runtime that copies arguments into static buffers must copy the
written rows back; one that does not says so in its adapter's `contracts["argument_writes"]` (the property is
then not applicable)."""

from __future__ import annotations

import pytest

from .checks import assert_same, clone
from .plan import serve


@pytest.mark.conformance("argument-writes-reach-the-caller")
def test_what_the_model_writes_into_its_arguments_reaches_the_caller(request, subject, served, device, plan):
    model, built = served
    case = subject.case

    def step(i: int, batch: int) -> None:
        args = case.inputs(batch, 10_000 + i, device)
        written = clone(args)
        expected = model(*written)
        assert_same(built(*args), expected)
        assert_same(list(args), list(written), "the arguments after the call")

    serve(plan, step, request.function.__name__)
