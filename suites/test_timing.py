"""Side-by-side timing (`harness.timing.interleaved_cuda_time_us`) on a fake clock: CUDA events replaced by a clock the
timed callables advance, so the test runs on a CPU and knows the true costs."""

from __future__ import annotations

import pytest
import torch

from pieceworks.harness import timing


class _Clock:
    """Milliseconds of fake time; calls inside [spell_start, spell_end) cost `spell` times more (a busy host)."""

    def __init__(self, spell_start: float, spell_end: float, spell: float) -> None:
        self.now = 0.0
        self.window = (spell_start, spell_end)
        self.spell = spell

    def work(self, cost_ms: float) -> None:
        slow = self.window[0] <= self.now < self.window[1]
        self.now += cost_ms * (self.spell if slow else 1.0)


def _fake_events(monkeypatch, clock: _Clock) -> None:
    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.at = None

        def record(self) -> None:
            self.at = clock.now

        def elapsed_time(self, end: "Event") -> float:
            return end.at - self.at

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)


def test_a_slow_spell_falls_on_both_sides_of_a_ratio(monkeypatch):
    """B costs twice A. A spell that triples every cost from the moment A's samples would have ended, had they been
    taken first, to the end of the run: timed in rotating rounds, B / A is still 2 (the spell covers both alike);
    timed one after the other it would read 6."""
    clock = _Clock(spell_start=280.0, spell_end=float("inf"), spell=3.0)
    _fake_events(monkeypatch, clock)
    fns = {"a": lambda: clock.work(1.0), "b": lambda: clock.work(2.0)}
    result = timing.interleaved_cuda_time_us(fns, warmup=20, reps=200, rounds=10)
    ratio = timing.ratio_over_rounds(result["b"], result["a"])
    assert ratio["rounds"] == 10 and len(result["a"]["round_medians_us"]) == 10
    assert ratio["median"] == pytest.approx(2.0), ratio
    assert result["a"]["median_us"] in (1000.0, 3000.0) and result["b"]["median_us"] in (2000.0, 6000.0)
