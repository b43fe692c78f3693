"""Mutants of CI: the benchmark gate (`pieceworks.gate`) and the GPU preflight."""

from __future__ import annotations

import dataclasses

import pytest

import pieceworks.gate as gate
import pieceworks.gate.preflight as preflight
import pieceworks.gate.results as results
import pieceworks.gate.thresholds as thresholds
import pieceworks.gate.verdicts as verdicts

from . import mutant

_GATE = "suites/test_gate.py::"


@mutant(
    "the gate computes base / head: slower looks faster",
    cpu=_GATE + "test_latency_regression_fails_with_a_table",
)
def gate_ratio_inverted(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(
        verdicts,
        "ratio_of",
        lambda base, head: 1.0 if base == head else base / head if head else float("inf"),
    )


@mutant(
    "every metric gets the latency threshold (10%), pool bytes included",
    cpu=_GATE + "test_memory_regression_beyond_two_percent_fails",
)
def gate_one_threshold_for_all(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(thresholds.Rule, "threshold", lambda self, spread: max(0.10, self.noise_k * spread))


@mutant(
    "the gate's threshold ignores the measured spread",
    cpu=_GATE + "test_noise_guard_widens_the_threshold_to_the_measured_spread",
)
def gate_ignores_noise(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(thresholds.Rule, "threshold", lambda self, spread: self.max_ratio - 1.0)


@mutant(
    "benchmarks missing from head are left out of the table",
    cpu=_GATE + "test_missing_benchmark_or_parameter_is_incomplete",
)
def gate_missing_is_ok(mp: pytest.MonkeyPatch) -> None:
    original = verdicts.compare

    def without_missing(base, head, thresholds):
        return [row for row in original(base, head, thresholds) if row.verdict != verdicts.MISSING]

    for module in (verdicts, gate):
        mp.setattr(module, "compare", without_missing)


@mutant(
    "a benchmark that failed in head does not make the comparison incomplete",
    cpu=_GATE + "test_failed_benchmark_is_incomplete",
)
def gate_failures_pass(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(verdicts, "INCOMPLETE", verdicts.INCOMPLETE - {verdicts.FAILED_IN_HEAD})


@mutant(
    "an improvement beyond the threshold fails like a regression",
    cpu=_GATE + "test_improvement_is_shown_not_failed",
)
def gate_improvements_fail(mp: pytest.MonkeyPatch) -> None:
    original = verdicts.judge

    def judge(*args, **kwargs):
        verdict, *rest = original(*args, **kwargs)
        return (verdicts.REGRESSED if verdict == verdicts.IMPROVED else verdict, *rest)

    mp.setattr(verdicts, "judge", judge)


@mutant(
    "a regression exits 2 when another item is incomplete",
    cpu=_GATE + "test_a_regression_of_ours_with_steady_controls_fails",
)
def gate_incomplete_hides_regression(mp: pytest.MonkeyPatch) -> None:
    def exit_status(rows):
        found = {r.verdict for r in rows}
        return 2 if found & verdicts.INCOMPLETE else 1 if found & verdicts.REGRESSION else 0

    for module in (verdicts, gate):
        mp.setattr(module, "exit_status", exit_status)


@mutant(
    "an unchanged item with a wide spread is 'too noisy': identical runs fail",
    cpu=_GATE + "test_a_change_too_noisy_to_judge_is_incomplete",
)
def gate_noise_fails_unchanged(mp: pytest.MonkeyPatch) -> None:
    original = verdicts.judge

    def judge(base, head, thresholds, unit, *sets):
        verdict, ratio, threshold, metric, note = original(base, head, thresholds, unit, *sets)
        rule = thresholds.rule_for(base.benchmark, unit)
        if verdict == verdicts.OK and threshold is not None and threshold > rule.max_noise:
            verdict = verdicts.TOO_NOISY
        return verdict, ratio, threshold, metric, note

    mp.setattr(verdicts, "judge", judge)


@mutant(
    "the gate judges drift over a whole benchmark: a slow spell on one batch size reads as regressions there",
    cpu=_GATE + "test_a_slow_spell_on_one_batch_size_is_drift_there_not_a_regression",
)
def gate_drift_per_benchmark(mp: pytest.MonkeyPatch) -> None:
    original = verdicts.params_of
    mp.setattr(
        verdicts, "params_of", lambda text: {k: v for k, v in original(text).items() if k == "implementation"}
    )


@mutant(
    "the gate judges every item, the controls that show drift between runs included",
    cpu=_GATE + "test_drift_of_the_environment_is_incomplete_not_a_regression",
)
def gate_ignores_controls(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(verdicts, "with_drift", lambda rows, thresholds: rows)


@mutant(
    "a benchmark that crashed in some rounds is judged on the rounds that ran",
    cpu=_GATE + "test_a_benchmark_that_failed_in_some_rounds_is_incomplete",
)
def gate_judges_the_rounds_that_ran(mp: pytest.MonkeyPatch) -> None:
    original = results.combined
    mp.setattr(results, "combined", lambda values: original([v for v in values if v is not None] or values))


@mutant("the trace-count rule tolerates one extra trace", cpu=_GATE + "test_trace_count_any_increase_fails")
def gate_tolerates_one_extra_trace(mp: pytest.MonkeyPatch) -> None:
    original = thresholds.Thresholds.rule_for

    def rule_for(self, benchmark, unit):
        rule = original(self, benchmark, unit)
        return dataclasses.replace(rule, abs_tolerance=1.0) if rule and rule.metric == "trace count" else rule

    mp.setattr(thresholds.Thresholds, "rule_for", rule_for)


def _ignore_preflight_check(mp: pytest.MonkeyPatch, check: str) -> None:
    original = preflight.assess

    def assess(readings, limits):
        return [
            dataclasses.replace(f, ok=True) if f.check == check else f for f in original(readings, limits)
        ]

    mp.setattr(preflight, "assess", assess)


@mutant(
    "the preflight reads other processes on the GPU but lets them pass",
    cpu="suites/test_preflight.py::test_another_process_on_the_gpu_is_busy",
)
def preflight_ignores_other_processes(mp: pytest.MonkeyPatch) -> None:
    _ignore_preflight_check(mp, "other processes")


@mutant(
    "the preflight reads NVML's used memory in GiB where it means MiB: "
    "a GPU 30 GB busy reads as 29 MiB in use",
    cpu="suites/test_preflight.py::test_memory_held_on_a_busy_gpu_is_read_in_mib_and_refused",
)
def preflight_memory_in_gib(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(preflight, "to_mib", lambda nbytes: nbytes / 2**30)


@mutant(
    "the preflight lets a GPU held below its clock pass",
    cpu="suites/test_preflight.py::test_a_clock_held_below_its_maximum_is_throttled",
)
def preflight_ignores_the_clock(mp: pytest.MonkeyPatch) -> None:
    _ignore_preflight_check(mp, "SM clock under load")
