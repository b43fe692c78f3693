"""`runtime_breakdown._call_profile`: what a compiled call adds over its plan run, from cProfile, on plain callables
(no GPU): a function only the call runs is named with its own time per call; what both run is subtracted. The
profiler reads a counting clock that only the functions below advance, so the expected times are exact."""

from __future__ import annotations

import cProfile

import pytest

runtime_breakdown = pytest.importorskip("pieceworks.harness.runtime_breakdown")

CLOCK = [0]  # in µs: advanced only by the "work" below, read by the profiler


def _spin(us: int) -> None:
    CLOCK[0] += us


def _checks_only_the_call_makes() -> None:
    CLOCK[0] += 7
    _spin(10)


def test_the_call_profile_names_what_only_the_call_runs(monkeypatch):
    real = cProfile.Profile
    monkeypatch.setattr(cProfile, "Profile", lambda: real(lambda: CLOCK[0], 1e-6))

    def plan() -> None:
        _spin(20)

    def call() -> None:
        _checks_only_the_call_makes()
        plan()

    found = runtime_breakdown._call_profile(1, call, plan, calls=20)
    assert found["batch"] == 1 and found["calls"] == 20
    added = {a["function"]: a for a in found["added"]}
    checks = [a for f, a in added.items() if "_checks_only_the_call_makes" in f]
    assert len(checks) == 1 and checks[0]["calls_per_call"] == 1
    assert checks[0]["us_per_call"] == pytest.approx(7)
    # the call spins 30 µs, the plan 20 µs: 10 µs is what the call adds (30 if the plan's were not subtracted)
    spin = next(a for f, a in added.items() if "_spin" in f)
    assert spin["us_per_call"] == pytest.approx(10)
