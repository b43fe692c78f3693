"""The conformance suite's plan (pieceworks.conformance.plan), without building anything: a seed draws the
same capture sizes every time and different seeds draw different ones; the sweep serves every batch up to
just above the largest size and batches far above it, both ways, each capture size twice in a row; drawn
sequences reach repeats, both orders, capture sizes, their neighbours and the largest batch; `serve` runs
the sweep, then drawn sequences (the same for the same seed), and a failure names the batches served up to
the failing call, shrunk where a drawn sequence found it."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import Phase, find, settings

from pieceworks.conformance.plan import FAR_BATCH, Plan, serve


def test_a_seed_draws_the_same_capture_sizes_and_other_seeds_draw_others():
    plans = [Plan.draw(s) for s in range(20)]
    assert plans == [Plan.draw(s) for s in range(20)]
    for plan in plans:
        sizes = list(plan.capture_sizes)
        assert sizes == sorted(set(sizes)) and 8 <= sizes[-1] <= 12 and 2 <= len(sizes) <= 4 and sizes[0] >= 1
    assert len({p.capture_sizes for p in plans}) >= 10


def test_the_size_options_bound_the_draw():
    for s in range(5):
        wide = Plan.draw(s, max_size=40, max_count=6).capture_sizes
        assert 8 <= max(wide) <= 40 and 2 <= len(wide) <= 6
        assert max(Plan.draw(s, max_size=5, max_count=3).capture_sizes) == 5
        assert Plan.draw(s, max_size=1, max_count=1).capture_sizes == (1,)
    with pytest.raises(ValueError, match="at least 1"):
        Plan.draw(0, max_size=0)


def test_the_sweep_serves_every_batch_up_to_just_above_the_largest_and_far_above_both_ways():
    plan = Plan(0, (3, 8))
    assert plan.sweep == [*range(1, 11), 17, FAR_BATCH, 8, 8, 3, 3, FAR_BATCH, 17, *range(10, 0, -1)]
    assert plan.batches == [*range(1, 11), 17, FAR_BATCH] and plan.largest_batch == 10
    large = Plan(0, (100, 200))
    assert {1, 2, 99, 100, 101, 199, 200, 201, 202, 401, 801} == set(
        large.sweep
    ) and large.largest_batch == 250


def test_a_models_largest_batch_caps_the_far_batches():
    assert Plan(0, (3, 8), max_batch=64).far == [17]
    assert Plan(0, (3, 8), max_batch=12).far == []


BOUNDARIES = {
    "a size repeated": lambda b: len(b) > 1 and len(set(b)) == 1,
    "ascending": lambda b: len(set(b)) > 2 and b == sorted(b),
    "descending": lambda b: len(set(b)) > 2 and b == sorted(b, reverse=True),
    "the smallest capture size": lambda b: 3 in b,
    "a batch between capture sizes": lambda b: 6 in b,
    "the largest batch": lambda b: 10 in b,
    "a batch above the largest size": lambda b: 9 in b,
}


@pytest.mark.parametrize("boundary", list(BOUNDARIES))
def test_drawn_sequences_reach(boundary):
    strategy = Plan(0, (3, 8)).sequences()
    find(
        strategy,
        BOUNDARIES[boundary],
        random=random.Random(0),
        settings=settings(max_examples=2000, database=None, deadline=None, phases=[Phase.generate]),
    )


def test_a_failure_names_the_batches_served_up_to_the_failing_call():
    def step(i, batch):
        assert batch != 3, "output: rows [2] of 3 differ\nmore detail"

    with pytest.raises(AssertionError) as caught:
        serve(Plan(0, (3, 8)), step, "test_probe")
    assert (
        str(caught.value).splitlines()[0]
        == "batches [1, 2, 3]: call 2 (batch 3): output: rows [2] of 3 differ"
    )


def _served(plan: Plan) -> list[list[int]]:
    sequences: list[list[int]] = []

    def step(i, batch):
        if i == 0:
            sequences.append([])
        sequences[-1].append(batch)

    serve(plan, step, "test_probe")
    return sequences


def test_the_sweep_comes_first_then_the_same_drawn_sequences_for_the_same_seed():
    first, again, other = _served(Plan(1, (3, 8))), _served(Plan(1, (3, 8))), _served(Plan(2, (3, 8)))
    assert first[0] == Plan(1, (3, 8)).sweep and len(first) >= 1 + 3
    assert first == again and first != other


def test_a_failure_only_drawn_sequences_meet_is_shrunk_to_one_call():
    def step(i, batch):  # the sweep starts at batch 1; drawn sequences start anywhere
        assert i > 0 or batch == 1, "a first call above batch 1"

    with pytest.raises(
        AssertionError, match=r"^batches \[3\]: call 0 \(batch 3\): a first call above batch 1"
    ):
        serve(Plan(0, (3, 8)), step, "test_probe")


def test_the_default_models_hold_a_bfloat16_one():
    """A runtime that computes a bfloat16 model in float32 meets one in the default run."""
    from pieceworks.conformance import cases, subjects

    dtypes = {
        p.dtype for name in subjects.DEFAULT_MODELS[:4] for p in cases.CASES[name].make("cpu").parameters()
    }
    assert {torch.float32, torch.bfloat16} <= dtypes, dtypes
