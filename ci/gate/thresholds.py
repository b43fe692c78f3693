"""Per-metric thresholds: which rule judges a benchmark, and how far it may move.

The file (ci/thresholds.json) holds an ordered list of rules; the first whose `match` (fnmatch patterns on the
asv benchmark name) and `units` (the benchmark's unit from benchmarks.json, where the rule lists any) fit a
benchmark judges it; a benchmark no rule fits is an error, so that a new benchmark gets a threshold on
purpose. Fields:

- `metric`: the name shown in the report; `gate`: false to show a metric without judging it.
- `max_ratio`: head / base above this is a regression (lower is better for every gated metric).
- `abs_tolerance`: a change of at most this many units is never a regression (counts: 0).
- `noise_k`: the threshold widens to `noise_k` times the relative spread measured in base or head, whichever
  is larger, when that exceeds `max_ratio - 1` (0: no noise guard).
- `max_noise`: a widened threshold above this cannot judge a change beyond `max_ratio`: such an item is too
  noisy (exit 2). A change inside `max_ratio` passes whatever the spread.
- `iqr_from`: the benchmark of the same class and parameters that reports this one's interquartile range in
  the same unit (e.g. "track_iqr_us" beside "track_median_us"); its relative half-width joins the measured
  spread.

`controls` (`{"param": "implementation", "values": [...]}`) names items measuring code no change of this
project touches: shown, never judged; where they moved beyond their rule's threshold, the gated items of their
benchmark and parameters are `environment drift` (verdicts.py). The file's "targets" and "own_checks" are the
report's; the gate ignores them.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import os

__all__ = ["Controls", "Rule", "Thresholds", "ThresholdsError", "DEFAULT_PATH", "load_thresholds"]

DEFAULT_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "thresholds.json")
_FIELDS = {
    "metric",
    "match",
    "units",
    "max_ratio",
    "abs_tolerance",
    "noise_k",
    "max_noise",
    "gate",
    "iqr_from",
    "about",
}


class ThresholdsError(ValueError):
    """A thresholds file that cannot be used; the message names the file, the rule and the field."""


@dataclasses.dataclass(frozen=True)
class Rule:
    metric: str
    match: tuple[str, ...]
    units: tuple[str, ...] = ()
    max_ratio: float = 1.10
    abs_tolerance: float = 0.0
    noise_k: float = 0.0
    max_noise: float = float("inf")
    gate: bool = True
    iqr_from: str | None = None

    def fits(self, benchmark: str, unit: str | None) -> bool:
        if self.units and unit not in self.units:
            return False
        return any(fnmatch.fnmatchcase(benchmark, pattern) for pattern in self.match)

    def threshold(self, spread: float) -> float:
        """Allowed relative increase: max_ratio - 1, widened to noise_k x spread when the spread is larger."""
        return max(self.max_ratio - 1.0, self.noise_k * spread)


@dataclasses.dataclass(frozen=True)
class Controls:
    """Items whose parameter `param` is one of `values` measure code the change under test cannot touch."""

    param: str
    values: frozenset[str]

    def covers(self, params: dict[str, str]) -> bool:
        return params.get(self.param) in self.values


@dataclasses.dataclass(frozen=True)
class Thresholds:
    path: str
    rules: tuple[Rule, ...]
    controls: Controls | None = None

    def rule_for(self, benchmark: str, unit: str | None) -> Rule | None:
        return next((r for r in self.rules if r.fits(benchmark, unit)), None)


def _rule(path: str, index: int, raw: object) -> Rule:
    where = f"{path}: rules[{index}]"
    if not isinstance(raw, dict):
        raise ThresholdsError(f"{where} is not an object")
    unknown = set(raw) - _FIELDS
    if unknown:
        raise ThresholdsError(f"{where}: unknown field(s) {sorted(unknown)}; known: {sorted(_FIELDS)}")
    if not isinstance(raw.get("metric"), str) or not raw.get("match"):
        raise ThresholdsError(f'{where} needs "metric" (a name) and "match" (a list of fnmatch patterns)')
    match = raw["match"]
    units = raw.get("units", [])
    if isinstance(match, str) or isinstance(units, str):
        raise ThresholdsError(f'{where}: "match" and "units" are lists, e.g. ["latency.*"]')
    numbers = {}
    for field in ("max_ratio", "abs_tolerance", "noise_k", "max_noise"):
        if field in raw:
            value = raw[field]
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0:
                raise ThresholdsError(f"{where}: {field} must be a non-negative number, got {value!r}")
            numbers[field] = float(value)
    if numbers.get("max_ratio", 1.1) < 1.0:
        raise ThresholdsError(
            f"{where}: max_ratio {numbers['max_ratio']} < 1 would fail an unchanged benchmark"
        )
    iqr_from = raw.get("iqr_from")
    if iqr_from is not None and (not isinstance(iqr_from, str) or "." in iqr_from):
        raise ThresholdsError(f'{where}: iqr_from names a method of the same class, e.g. "track_iqr_us"')
    return Rule(
        metric=raw["metric"],
        match=tuple(match),
        units=tuple(units),
        gate=bool(raw.get("gate", True)),
        iqr_from=iqr_from,
        **numbers,
    )


def load_thresholds(path: str = DEFAULT_PATH) -> Thresholds:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as exc:
        raise ThresholdsError(
            f"{path}: cannot read the thresholds file ({exc}); pass --thresholds FILE"
        ) from exc
    rules = data.get("rules") if isinstance(data, dict) else None
    if not isinstance(rules, list) or not rules:
        raise ThresholdsError(f'{path}: needs a non-empty "rules" list (see ci/README.md)')
    return Thresholds(path, tuple(_rule(path, i, raw) for i, raw in enumerate(rules)), _controls(path, data))


def _controls(path: str, data: dict) -> Controls | None:
    raw = data.get("controls")
    if raw is None:
        return None
    values = raw.get("values") if isinstance(raw, dict) else None
    if (
        not isinstance(raw, dict)
        or not isinstance(raw.get("param"), str)
        or not isinstance(values, list)
        or not values
        or not all(isinstance(v, str) for v in values)
        or set(raw) - {"param", "values", "about"}
    ):
        raise ThresholdsError(
            f'{path}: "controls" is {{"param": NAME, "values": [VALUE, ...]}}, e.g. '
            f'{{"param": "implementation", "values": ["eager"]}}'
        )
    return Controls(raw["param"], frozenset(values))
