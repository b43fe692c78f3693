"""Reading asv result files: one commit's result set for the gate, each benchmark's newest run for the report.

asv 0.6 writes `<results_dir>/<machine>/<commit[:8]>-<env>.json`: `result_columns` names the columns of each
row in `results`; the `result` column holds one value for a benchmark without parameters or one value per
parameter combination, in `itertools.product(*params)` order; `null` means failed (the whole column `null`:
all failed), `NaN` means skipped (`NotImplementedError` in setup). `stats_q_25` / `stats_q_75` are there for
`time_` benchmarks. `<results_dir>/benchmarks.json` gives each benchmark's `unit`, `type` and `param_names`.
Standard library only.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import statistics
from typing import TypeGuard

__all__ = [
    "FAILED",
    "SKIPPED",
    "Item",
    "ResultSet",
    "ResultSetError",
    "combined",
    "is_number",
    "load_result_set",
    "newest_runs",
    "result_files",
    "values_of",
]

FAILED = "failed"
SKIPPED = "skipped"
_NOT_RESULTS = {"machine.json", "benchmarks.json"}


class ResultSetError(ValueError):
    """A path that is not a usable asv result set; the message names the path and what to pass instead."""


@dataclasses.dataclass(frozen=True)
class Item:
    """One benchmark at one parameter combination, over all rounds of a set.

    `value` is the median over the rounds that measured it, or FAILED (some round failed) or SKIPPED (every
    round skipped). `spread` is a relative half-width of the spread seen, 0.0 when nothing says how noisy it
    is: the larger of asv's interquartile range ((q75 - q25) / 2 / median, per round) and the spread of the
    per-round values (half the range for fewer than four rounds, else half the interquartile range, over the
    median).
    """

    benchmark: str
    params: tuple[str, ...]
    value: float | str
    spread: float
    rounds: int


@dataclasses.dataclass
class ResultSet:
    """One side of a comparison: the result files (rounds) of one commit, machine and environment."""

    label: str
    commit: str
    machine: str
    env: str
    files: list[str]
    items: dict[tuple[str, tuple[str, ...]], Item]
    meta: dict[str, dict]  # benchmarks.json entries by benchmark name (empty when not found)

    def unit(self, benchmark: str) -> str | None:
        return self.meta.get(benchmark, {}).get("unit")

    def param_names(self, benchmark: str) -> list[str]:
        return list(self.meta.get(benchmark, {}).get("param_names") or [])


def result_files(path: str, commit: str | None = None) -> list[str]:
    """`path` itself if it is a file, else the asv result files under it (of `commit` only, if given), sorted;
    raises ResultSetError where there are none."""
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise ResultSetError(
            f"{path}: no such file or folder; pass an asv result file "
            "(<results_dir>/<machine>/<commit>-<env>.json) or a folder of them"
        )
    found = sorted(
        os.path.join(root, name)
        for root, _, names in os.walk(path)
        for name in names
        if name.endswith(".json") and name not in _NOT_RESULTS
    )
    if commit:
        found = [f for f in found if os.path.basename(f).startswith(commit[:8])]
    if not found:
        raise ResultSetError(
            f"{path}: no asv result files"
            + (f" of commit {commit}" if commit else "")
            + " in it (asv writes <machine>/<commit[:8]>-<env>.json under its results_dir)"
        )
    return found


def _load_json(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)  # asv writes NaN for skipped results; Python's json reads it
    except (OSError, ValueError) as exc:
        raise ResultSetError(f"{path}: not readable as JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ResultSetError(f"{path}: not an asv result file (top level is not an object)")
    return data


def _benchmarks_json(files: list[str]) -> dict[str, dict]:
    """benchmarks.json beside the files, or one or two folders up (the asv results_dir)."""
    for folder in dict.fromkeys(os.path.dirname(os.path.abspath(f)) for f in files):
        for _ in range(3):
            candidate = os.path.join(folder, "benchmarks.json")
            if os.path.isfile(candidate):
                return {k: v for k, v in _load_json(candidate).items() if isinstance(v, dict)}
            folder = os.path.dirname(folder)
    return {}


def is_number(x: object) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)


def _checked(path: str, data: dict) -> dict:
    if data.get("version") != 2 or "result_columns" not in data or "results" not in data:
        raise ResultSetError(
            f"{path}: not an asv 0.6 result file (needs version 2, result_columns, results); "
            "run `asv update` on older results"
        )
    return data


def values_of(path: str, data: dict, name: str) -> list[tuple[tuple[str, ...], object, float]]:
    """(params as asv writes them, value, spread) of every parameter combination of benchmark `name` in one
    result file: the value as stored (None failed, NaN skipped), the spread asv's relative IQR half-width,
    else 0.0."""
    cells = dict(zip(data["result_columns"], data["results"][name]))
    params = cells.get("params") or []
    combos = [tuple(c) for c in itertools.product(*params)] if params else [()]
    values = cells.get("result")
    if values is None:  # asv stores an all-failed benchmark as a single null
        values = [None] * len(combos)
    if len(values) != len(combos):
        raise ResultSetError(
            f"{path}: {name} has {len(values)} results for {len(combos)} parameter combinations"
        )
    q25 = cells.get("stats_q_25") or [None] * len(combos)
    q75 = cells.get("stats_q_75") or [None] * len(combos)
    return [
        (
            combo,
            value,
            abs(hi - lo) / 2 / abs(value) if all(map(is_number, (value, lo, hi))) and value else 0.0,
        )
        for combo, value, lo, hi in zip(combos, values, q25, q75)
    ]


def newest_runs(files: list[str]) -> dict[str, tuple[float, str, dict]]:
    """{benchmark: (started, file, document)}: each benchmark of `files` from the file whose run of it started
    last (asv's `started_at`; the first file on a tie). Commits mix: the report's view, never a set the gate
    compares."""
    newest: dict[str, tuple[float, str, dict]] = {}
    for f in files:
        data = _checked(f, _load_json(f))
        for name, row in data["results"].items():
            started = dict(zip(data["result_columns"], row)).get("started_at") or 0
            if name not in newest or started > newest[name][0]:
                newest[name] = (started, f, data)
    return newest


def _round_spread(values: list[float]) -> float:
    centre = statistics.median(values)
    if len(values) < 2 or not centre:
        return 0.0
    if len(values) < 4:
        return (max(values) - min(values)) / 2 / abs(centre)
    q = statistics.quantiles(values, n=4)
    return (q[2] - q[0]) / 2 / abs(centre)


def combined(values: list[object]) -> float | str:
    """One item's value over the rounds of a set (as stored: None failed, NaN skipped): FAILED if any round
    failed (a benchmark that crashed in some rounds is not judged on the rounds that ran), SKIPPED if every
    round skipped, else the median of the measured rounds."""
    numbers = [v for v in values if is_number(v)]
    if any(v is None for v in values):
        return FAILED
    return float(statistics.median(numbers)) if numbers else SKIPPED


def load_result_set(spec: str, label: str | None = None) -> ResultSet:
    """Load `PATH` or `PATH@COMMIT` (a results folder holding several commits: pick one by hash prefix).

    All files of a set must come from one commit, machine and environment; anything else is a ResultSetError
    naming them, since averaging different code or hardware would hide exactly what the gate looks for.
    """
    path, _, commit = spec.partition("@") if "@" in os.path.basename(spec) else (spec, "", "")
    files = result_files(path, commit or None)
    loaded = [(f, _checked(f, _load_json(f))) for f in files]
    identities = {
        (d.get("commit_hash"), (d.get("params") or {}).get("machine"), d.get("env_name")) for _, d in loaded
    }
    if len(identities) != 1:
        listing = ", ".join(sorted(f"{c[:8] if c else '?'} on {m} ({e})" for c, m, e in identities))
        raise ResultSetError(
            f"{spec}: result files of more than one commit/machine/environment ({listing}); "
            "pass one file, a folder of one commit's rounds, or PATH@COMMIT"
        )
    ((commit_hash, machine, env),) = identities
    per_item: dict[tuple[str, tuple[str, ...]], list[tuple[object, float]]] = {}
    for f, data in loaded:
        for name in data["results"]:
            for combo, value, spread in values_of(f, data, name):
                per_item.setdefault((name, combo), []).append((value, spread))
    items = {}
    for (name, combo), seen in per_item.items():
        numbers = [v for v, _ in seen if is_number(v)]
        spread = max([s for _, s in seen] + [_round_spread(numbers) if numbers else 0.0])
        items[(name, combo)] = Item(name, combo, combined([v for v, _ in seen]), spread, len(seen))
    return ResultSet(
        label or spec, commit_hash or "", machine or "", env or "", files, items, _benchmarks_json(files)
    )
