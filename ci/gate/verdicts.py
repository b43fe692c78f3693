"""Judging head against base, item by item: the verdicts and the exit status they add up to.

A regression exits 1 even when other items are incomplete. Otherwise every benchmark and parameter combination
that base measured must be measured by head, or the comparison is incomplete (exit 2). A change inside a
rule's narrowest threshold passes whatever the spread (identical inputs always pass); a larger one that the
spread cannot tell from noise is "too noisy". Items base did not measure (new benchmarks, or ones base skipped
or failed) are shown as `new` and never fail the gate: the base set defines what is guarded. Control items
(thresholds' `controls`) are shown as `control`; controls that moved beyond their threshold turn the judged
items of their benchmark and parameters (a batch size, say) into `environment drift` (exit 2): those runs
cannot be compared.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import statistics

from .results import FAILED, SKIPPED, Item, ResultSet
from .thresholds import Rule, Thresholds

__all__ = ["Row", "compare", "exit_status", "INCOMPLETE", "REGRESSION"]

# Verdicts. REGRESSION makes the exit status 1, else INCOMPLETE ones 2; the others are shown only.
MISSING, FAILED_IN_HEAD, SKIPPED_IN_HEAD = "missing", "failed", "skipped in head"
TOO_NOISY, NO_RULE = "too noisy", "no rule"
REGRESSED, IMPROVED, OK, NEW, SKIPPED_BOTH, INFO = "regression", "improved", "ok", "new", "skipped", "info"
CONTROL, DRIFT = "control", "environment drift"
INCOMPLETE = frozenset({MISSING, FAILED_IN_HEAD, SKIPPED_IN_HEAD, TOO_NOISY, NO_RULE, DRIFT})
REGRESSION = frozenset({REGRESSED})


@dataclasses.dataclass(frozen=True)
class Row:
    benchmark: str
    params: str
    base: float | str | None
    head: float | str | None
    ratio: float | None
    threshold: float | None  # allowed relative increase, noise guard included
    verdict: str
    metric: str = ""
    unit: str | None = None
    note: str = ""


def _params_text(names: list[str], combo: tuple[str, ...]) -> str:
    if not combo:
        return ""
    names = names if len(names) == len(combo) else [f"p{i}" for i in range(len(combo))]
    return ", ".join(f"{n}={v}" for n, v in zip(names, combo))


def ratio_of(base: float, head: float) -> float:
    """head / base, with 0 / 0 = 1 and x / 0 = inf: a count that was zero and no longer is has regressed."""
    if base == 0:
        return 1.0 if head == 0 else math.inf
    return head / base


def iqr_spread(results: ResultSet, item: Item, rule: Rule) -> float:
    """Relative half-width of the IQR a companion benchmark (rule.iqr_from) reports for this item, else 0."""
    if not rule.iqr_from or not isinstance(item.value, float) or not item.value:
        return 0.0
    companion = results.items.get((item.benchmark.rsplit(".", 1)[0] + "." + rule.iqr_from, item.params))
    if companion is None or not isinstance(companion.value, float):
        return 0.0
    return abs(companion.value) / 2 / abs(item.value)


def judge(
    base: Item,
    head: Item,
    thresholds: Thresholds,
    unit: str | None,
    base_set: ResultSet | None = None,
    head_set: ResultSet | None = None,
) -> tuple[str, float | None, float | None, str, str]:
    """(verdict, ratio, threshold, metric, note) for an item both sides measured."""
    rule = thresholds.rule_for(base.benchmark, unit)
    if rule is None:
        return (
            NO_RULE,
            None,
            None,
            "",
            f"no rule in {thresholds.path} fits this benchmark (unit {unit}): add one",
        )
    base_value, head_value = base.value, head.value
    if not isinstance(base_value, float) or not isinstance(head_value, float):
        raise TypeError(f"judge compares two measured values, not {base_value!r} and {head_value!r}")
    ratio = ratio_of(base_value, head_value)
    spread = max(
        base.spread,
        head.spread,
        iqr_spread(base_set, base, rule) if base_set else 0.0,
        iqr_spread(head_set, head, rule) if head_set else 0.0,
    )
    threshold = rule.threshold(spread)
    note = f"widened by noise ({spread:.1%} spread)" if threshold > rule.max_ratio - 1.0 + 1e-12 else ""
    if not rule.gate:
        return INFO, ratio, None, rule.metric, note
    # noise only ever widens it: a change inside it passes whatever the spread
    narrowest = rule.max_ratio - 1.0
    if (
        abs(head_value - base_value) <= rule.abs_tolerance
        or 1.0 / (1.0 + narrowest) <= ratio <= 1.0 + narrowest
    ):
        return OK, ratio, threshold, rule.metric, note
    if threshold > rule.max_noise:
        return (
            TOO_NOISY,
            ratio,
            threshold,
            rule.metric,
            (
                f"moved {ratio - 1.0:+.0%} with a spread of {spread:.1%}, "
                f"which allows {threshold:.0%}, more than max_noise "
                f"{rule.max_noise:.0%}: rerun on a quiet GPU"
            ),
        )
    if ratio > 1.0 + threshold:
        return REGRESSED, ratio, threshold, rule.metric, note
    if ratio < 1.0 / (1.0 + threshold):
        return IMPROVED, ratio, threshold, rule.metric, note
    return OK, ratio, threshold, rule.metric, note


def params_of(text: str) -> dict[str, str]:
    """`implementation='eager', batch=1` -> {"implementation": "eager", "batch": "1"}."""
    pairs = (part.split("=", 1) for part in text.split(", ") if "=" in part)
    return {name: value.strip("'\"") for name, value in pairs}


def with_drift(rows: list[Row], thresholds: Thresholds) -> list[Row]:
    """Control rows become `control`. Rows are grouped by benchmark and every parameter but the controls'
    (e.g. one batch size of one latency benchmark: a slow spell can fall on some batch sizes of a run and not
    others); where a group's controls moved (median ratio) beyond the threshold their rule allows, its judged
    rows become `environment drift`."""
    controls = thresholds.controls
    if controls is None:
        return rows

    def group(row: Row) -> tuple:
        return row.benchmark, tuple(
            sorted((k, v) for k, v in params_of(row.params).items() if k != controls.param)
        )

    is_control = [controls.covers(params_of(r.params)) and r.ratio is not None for r in rows]
    moved: dict[tuple, list[tuple[float, float]]] = {}
    for row, control in zip(rows, is_control):
        if control and row.ratio is not None and row.threshold is not None and row.verdict != TOO_NOISY:
            moved.setdefault(group(row), []).append((row.ratio, row.threshold))
    drifted: dict[tuple, str] = {}
    for key, pairs in moved.items():
        ratio = statistics.median(m[0] for m in pairs)
        allowed = statistics.median(m[1] for m in pairs)
        if ratio > 1.0 + allowed or ratio < 1.0 / (1.0 + allowed):
            drifted[key] = (
                f"controls ({', '.join(sorted(controls.values))}) moved {ratio - 1.0:+.0%} (median of "
                f"{len(pairs)}), beyond {allowed:.0%}: the environment changed between the runs; rerun"
            )
    out = []
    for row, control in zip(rows, is_control):
        if control:
            row = dataclasses.replace(
                row,
                verdict=CONTROL,
                note="; ".join(filter(None, [row.note, "unchanged code: shows drift between the runs"])),
            )
        elif group(row) in drifted and row.verdict in (REGRESSED, IMPROVED, OK):
            row = dataclasses.replace(row, verdict=DRIFT, note=drifted[group(row)])
        out.append(row)
    return out


def compare(base: ResultSet, head: ResultSet, thresholds: Thresholds) -> list[Row]:
    rows = []
    keys = list(base.items) + [k for k in head.items if k not in base.items]
    for key in sorted(keys, key=lambda k: k[0]):  # by benchmark; parameters in asv's order
        name, combo = key
        b, h = base.items.get(key), head.items.get(key)
        unit = base.unit(name) or head.unit(name)
        params = _params_text(base.param_names(name) or head.param_names(name), combo)
        bval = b.value if b else None
        hval = h.value if h else None
        cell = functools.partial(Row, benchmark=name, params=params, base=bval, head=hval, unit=unit)
        if b is None or not isinstance(bval, float):
            verdict = SKIPPED_BOTH if (bval == SKIPPED or b is None) and hval == SKIPPED else NEW
            rows.append(
                cell(
                    ratio=None,
                    threshold=None,
                    verdict=verdict,
                    note="" if verdict == SKIPPED_BOTH else f"base {bval or 'absent'}: not guarded",
                )
            )
            continue
        if h is None:
            rows.append(
                cell(ratio=None, threshold=None, verdict=MISSING, note="base measured it; head has no result")
            )
            continue
        if hval == FAILED:
            rows.append(
                cell(ratio=None, threshold=None, verdict=FAILED_IN_HEAD, note="see the asv log of head")
            )
            continue
        if hval == SKIPPED:
            rows.append(
                cell(
                    ratio=None,
                    threshold=None,
                    verdict=SKIPPED_IN_HEAD,
                    note="base measured it; head skipped it (NotImplementedError in setup)",
                )
            )
            continue
        verdict, ratio, threshold, metric, note = judge(b, h, thresholds, unit, base, head)
        bver = base.meta.get(name, {}).get("version")
        hver = head.meta.get(name, {}).get("version")
        if bver and hver and bver != hver:
            note = "; ".join(filter(None, [note, "benchmark code changed since base"]))
        rows.append(cell(ratio=ratio, threshold=threshold, verdict=verdict, metric=metric, note=note))
    return with_drift(rows, thresholds)


def exit_status(rows: list[Row]) -> int:
    """1 if anything regressed (whatever else is incomplete: a regression is never hidden), else 2 if anything
    base measured could not be compared, else 0."""
    verdicts = {r.verdict for r in rows}
    if verdicts & REGRESSION:
        return 1
    if verdicts & INCOMPLETE:
        return 2
    return 0
