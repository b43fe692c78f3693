"""`side_by_side._call_profile`: what a compiled call adds over its plan run, from cProfile, on plain
callables (no GPU): a function only the call runs is named with its own time per call; what both run is
subtracted. The profiler reads a counting clock that only the functions below advance, so the expected times
are exact."""

from __future__ import annotations

import cProfile

import pytest

from pieceworks.harness.measure import side_by_side

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

    found = side_by_side._call_profile(1, call, plan, calls=20)
    assert found["batch"] == 1 and found["calls"] == 20
    added = {a["function"]: a for a in found["added"]}
    checks = [a for f, a in added.items() if "_checks_only_the_call_makes" in f]
    assert len(checks) == 1 and checks[0]["calls_per_call"] == 1
    assert checks[0]["us_per_call"] == pytest.approx(7)
    # the call spins 30 µs, the plan 20 µs: 10 µs is what the call adds (30 if the plan's were not subtracted)
    spin = next(a for f, a in added.items() if "_spin" in f)
    assert spin["us_per_call"] == pytest.approx(10)


# ---- the side-by-side run's builds and rows, on a CPU: CUDA events replaced by a clock the callables advance
def _fake_cuda_events(monkeypatch, clock: list[float]) -> None:
    import torch

    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.at = 0.0

        def record(self) -> None:
            self.at = clock[0]

        def elapsed_time(self, end: Event) -> float:
            return end.at - self.at

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)


def test_builds_record_what_was_built_skipped_or_failed_and_build_reduce_overhead_last(capsys):
    import torch

    from pieceworks.harness.models import toy as models

    report = {"skipped": {}, "errors": {}, "build_s": {}}
    config = models.ToyLlamaConfig(hidden_size=16, mlp_size=32, vocab_size=16, num_layers=2)
    make = lambda b: models.toy_llama_inputs(b, config, seed=b)  # noqa: E731
    built = side_by_side._build_all(
        models.ToyLlama(config), make, [1, 8], ["reduce-overhead", "eager", "no-such"], report
    )
    assert list(built) == ["eager"] and set(report["build_s"]) == {"eager"}
    assert set(report["errors"]) == {"build no-such"} and "no-such" in report["errors"]["build no-such"]
    if not torch.cuda.is_available():
        assert "CUDA" in report["skipped"]["reduce-overhead"]
    printed = capsys.readouterr().out
    assert (
        printed.index("build eager") < printed.index("build no-such") < printed.index("build reduce-overhead")
    )


def test_a_row_checks_each_variant_times_the_rest_side_by_side_and_leaves_out_what_fails(monkeypatch):
    import torch

    from pieceworks.harness.adapters import Built

    clock = [0.0]

    def costing(ms: float, shift: float):
        def fn(x):
            clock[0] += ms
            return x * 2 + shift

        return Built(fn)

    def broken(x):
        raise RuntimeError("no graph for this size")

    _fake_cuda_events(monkeypatch, clock)
    built = {"FULL": costing(1.0, 0.0), "meta-pcg": Built(broken), "reduce-overhead": costing(2.0, 1.0)}
    report = {"errors": {}}
    row, timed = side_by_side._row(built, lambda x: x * 2, (torch.ones(4),), 4, 10, report)
    assert list(timed) == ["FULL", "reduce-overhead"] and list(report["errors"]) == ["meta-pcg batch 4"]
    assert row["us"]["FULL"]["median_us"] == 1000.0 and row["us"]["reduce-overhead"]["median_us"] == 2000.0
    assert row["us"]["FULL"]["max_abs_error_vs_eager"] == 0.0
    assert row["us"]["reduce-overhead"]["max_abs_error_vs_eager"] == 1.0
    assert row["ratios"]["FULL / reduce-overhead"] == {"median": 0.5, "min": 0.5, "max": 0.5, "rounds": 10}
    assert row["ratios"]["PIECEWISE / meta-pcg"] is None and row["pieces"] is None
