"""`runtime_breakdown._call_profile`: what a compiled call adds over its plan run, from cProfile, on plain callables
(no GPU): a function only the call runs is named with its own time per call; what both run is not."""

from __future__ import annotations

import pytest

runtime_breakdown = pytest.importorskip("pieceworks.harness.runtime_breakdown")


def _spin(n: int) -> int:
    total = 0
    for i in range(n):
        total += i
    return total


def _shared_work() -> None:
    _spin(20_000)


def _checks_only_the_call_makes() -> None:
    _spin(10_000)


def test_the_call_profile_names_what_only_the_call_runs():
    def plan() -> None:
        _shared_work()

    def call() -> None:
        _checks_only_the_call_makes()
        plan()

    found = runtime_breakdown._call_profile(1, call, plan, calls=20)
    assert found["batch"] == 1 and found["calls"] == 20
    assert found["seconds"]["compiled call"] > found["seconds"]["plan run"]
    added = {a["function"]: a for a in found["added"]}
    only_the_call = [a for f, a in added.items() if "_checks_only_the_call_makes" in f]
    assert len(only_the_call) == 1 and only_the_call[0]["calls_per_call"] == 1
    # the spinning both do is subtracted: the call spins 30k, the plan 20k, so what is left is about half the plan's
    # spin per call (not subtracted, it would be 1.5 times it)
    spin = next(a for f, a in added.items() if "_spin" in f)
    plan_alone = runtime_breakdown.host_profile(lambda: [plan() for _ in range(20)], top=60)
    spin_in_plan_us = 1e6 * next(r for r in plan_alone["top"] if "_spin" in r["function"])["tottime_s"] / 20
    assert spin["us_per_call"] < spin_in_plan_us
