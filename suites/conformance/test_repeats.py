"""repeats-give-fresh-outputs (every implementation): a runtime that keeps state per size (a graph, static
buffers, the last call's outputs) must compute every call afresh. Each batch of the sweep and of drawn
sequences is served three times in a row: new inputs A, new inputs B, then A's values again in new tensors;
consecutive batches of the sweep pad to the same captured size. Every output must equal eager's on that call's
inputs."""

from __future__ import annotations

import pytest

from .checks import assert_same, clone
from .plan import serve


@pytest.mark.conformance("repeats-give-fresh-outputs")
def test_a_size_served_again_gives_each_calls_own_outputs(request, subject, served, device, plan):
    model, built = served
    case = subject.case

    def step(i: int, batch: int) -> None:
        for where, seed in (
            ("first of three", 8000 + i),
            ("second, new inputs", 9000 + i),
            ("third, the first inputs again", 8000 + i),
        ):
            args = case.inputs(batch, seed, device)
            expected = model(*clone(args))
            assert_same(built(*args), expected, f"output ({where})")

    serve(plan, step, request.function.__name__)
