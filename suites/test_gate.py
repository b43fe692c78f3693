"""The benchmark gate (`python -m pieceworks.gate`) on result sets derived from a real asv result file.

Every case starts from SOURCE, a result set written by asv 0.6 itself, copies it as base, edits a copy into
head (one benchmark slower, a pool bigger, a result null or gone, ...) in asv's own format, and checks the
verdicts, the table and the exit status. Items are picked by the metric their threshold rule assigns, so
SOURCE can be any asv results folder: point it at the committed H100 results (results/asv) and every case
still applies.
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from pieceworks.gate import compare, exit_status, load_result_set, load_thresholds
from pieceworks.gate.results import result_files
from pieceworks.gate.thresholds import DEFAULT_PATH
from pieceworks.gate.verdicts import iqr_spread

REPO = Path(__file__).resolve().parent.parent
SOURCE = REPO / "suites" / "data" / "asv_sample"  # written by asv 0.6.6 from stand-ins with the suites' names
H100 = REPO / "suites" / "data" / "report_sample" / "asv"  # H100 runs of several commits (its README)


def _fullest_h100_file() -> Path:
    """The committed H100 asv result file with the most latency benchmarks: the run of the whole suite (a
    later run of a few benchmarks, the Llama models' say, has other spreads: none of its items may be too
    noisy to judge)."""
    files = result_files(str(H100 / "nvidia-h100-80gb-hbm3"))
    return Path(
        max(
            files,
            key=lambda f: sum(n.startswith("latency.") for n in json.loads(Path(f).read_text())["results"]),
        )
    )


THRESHOLDS = load_thresholds(DEFAULT_PATH)
UNJUDGED = {"ok", "skipped", "info", "control"}  # verdicts of items nothing happened to


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not math.isnan(x)


def _source_file() -> Path:
    """The result file of SOURCE with the most measured values (one full run)."""
    files = sorted(p for p in SOURCE.rglob("*.json") if p.name not in ("machine.json", "benchmarks.json"))
    assert files, f"no asv result files under {SOURCE}"

    def measured(p: Path) -> int:
        data = json.loads(p.read_text())
        col = data["result_columns"].index("result")
        return sum(_is_number(v) for row in data["results"].values() for v in (row[col] or []))

    return max(files, key=measured)


def _params(results, name: str, combo: tuple) -> dict[str, str]:
    return {n: str(v).strip("'\"") for n, v in zip(results.param_names(name), combo)}


class Sets:
    """Base = SOURCE's result file as is; head = an edited copy. Both written in asv's layout under
    tmp_path."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.file = _source_file()
        self.base = json.loads(self.file.read_text())
        self.head = copy.deepcopy(self.base)
        meta_file = next(
            (d / "benchmarks.json" for d in self.file.parents if (d / "benchmarks.json").is_file()), None
        )
        self.meta = json.loads(meta_file.read_text()) if meta_file else {}
        self.cols = self.base["result_columns"]

    # --- choosing items -------------------------------------------------------------------------------------
    def pick(self, metric: str, *, value=None, quiet: bool = True) -> tuple[str, int]:
        """(benchmark, index into its results) of a measured item whose rule is `metric`; with `quiet`, one
        whose measured spread keeps the rule's own threshold (the cases below assume it)."""
        measured = load_result_set(str(self.file))
        keys = list(measured.items)
        for key, item in measured.items.items():
            name, combo = key
            rule = THRESHOLDS.rule_for(name, measured.unit(name))
            if rule is None or rule.metric != metric or not isinstance(item.value, float) or item.value == 0:
                continue
            if value is not None and item.value != value:
                continue
            if THRESHOLDS.controls and THRESHOLDS.controls.covers(_params(measured, name, combo)):
                continue  # a control item is never judged itself: it tells drift (test_drift_* below)
            spread = max(item.spread, iqr_spread(measured, item, rule))
            if quiet and rule.noise_k * spread > rule.max_ratio - 1:
                continue
            return name, [k for k in keys if k[0] == name].index(key)
        pytest.skip(f"{SOURCE} has no measured {metric} item" + (" with a small spread" if quiet else ""))

    # --- editing head (or base) in asv's format -------------------------------------------------------------
    def _row(self, data: dict, name: str) -> list:
        row = data["results"][name]
        row.extend([None] * (len(self.cols) - len(row)))  # asv drops trailing empty columns
        return row

    def value(self, name: str, i: int, data: dict | None = None) -> float:
        return (data or self.base)["results"][name][self.cols.index("result")][i]

    def set(self, name: str, i: int, value, data: dict | None = None) -> None:
        row = self._row(self.head if data is None else data, name)
        col = self.cols.index("result")
        n = len(self._combos(name))
        if row[col] is None:
            row[col] = [None] * n
        row[col][i] = value
        for column in ("stats_q_25", "stats_q_75", "stats_ci_99_a", "stats_ci_99_b"):
            if (
                row[self.cols.index(column)] is not None
            ):  # keep asv's statistics consistent with the new value
                row[self.cols.index(column)][i] = None

    def scale(self, name: str, i: int, factor: float) -> None:
        self.set(name, i, self.value(name, i) * factor)

    def spread(self, data: dict, name: str, i: int, relative: float) -> None:
        """Give the item asv statistics: an interquartile range of +-relative around its value."""
        row = self._row(data, name)
        value = row[self.cols.index("result")][i]
        n = len(self._combos(name))
        for column, sign in (("stats_q_25", -1), ("stats_q_75", +1)):
            cells = row[self.cols.index(column)] or [None] * n
            cells[i] = value * (1 + sign * relative)
            row[self.cols.index(column)] = cells

    def _combos(self, name: str) -> list:
        params = self.base["results"][name][self.cols.index("params")] or []
        n = 1
        for p in params:
            n *= len(p)
        return [None] * n

    # --- writing and running --------------------------------------------------------------------------------
    def write(self, side: str, data: dict, filename: str | None = None) -> Path:
        root = self.tmp / side
        machine = root / data["params"]["machine"]
        machine.mkdir(parents=True, exist_ok=True)
        if self.meta:
            (root / "benchmarks.json").write_text(json.dumps(self.meta))
        path = machine / (filename or self.file.name)
        path.write_text(json.dumps(data))
        return machine

    def run(self, head: dict | None = None):
        base_set = load_result_set(str(self.write("base", self.base)))
        head_set = load_result_set(str(self.write("head", self.head if head is None else head)))
        rows = compare(base_set, head_set, THRESHOLDS)
        return rows, exit_status(rows)


@pytest.fixture
def sets(tmp_path):
    return Sets(tmp_path)


def _verdicts(rows, name=None):
    return {(r.benchmark, r.params): r.verdict for r in rows if name is None or r.benchmark == name}


def _row(rows, sets, name, i):
    base = load_result_set(str(sets.write("base", sets.base)))
    combo = [k for k in base.items if k[0] == name][i][1]
    names = base.param_names(name)
    params = ", ".join(f"{n}={v}" for n, v in zip(names, combo)) if len(names) == len(combo) else None
    matches = [r for r in rows if r.benchmark == name and (params is None or r.params == params)]
    assert len(matches) == 1, (name, i, params, [r.params for r in rows if r.benchmark == name])
    return matches[0]


def test_the_source_is_an_asv_result_set_with_every_metric():
    data = json.loads(_source_file().read_text())
    assert data["version"] == 2 and "result_columns" in data
    result_set = load_result_set(str(_source_file()))
    metrics = {THRESHOLDS.rule_for(name, result_set.unit(name)).metric for name, _ in result_set.items}
    assert {"latency", "memory", "compile/capture time"} <= metrics


def test_identical_sets_pass(sets):
    rows, status = sets.run()
    assert status == 0
    assert {r.verdict for r in rows} <= {"ok", "skipped", "info", "control"}
    assert all(r.ratio == 1.0 for r in rows if r.verdict in ("ok", "info"))


COMMITTED = sorted(p for p in H100.glob("*/*.json") if p.name != "machine.json")


@pytest.mark.parametrize("run", COMMITTED, ids=lambda p: f"{p.parent.name}/{p.name.split('-')[0]}")
def test_every_committed_run_passes_against_itself(run, capsys):
    """Identical inputs exit 0 with every ratio 1.0: no 'too noisy' (a change of nothing is inside any
    threshold), no 'no rule', no regression, whatever the spread the run measured. The gate's `main` in this
    process (its command line in a process of its own: test_command_line_table_markdown_and_exit_status)."""
    from pieceworks.gate.__main__ import main

    status = main(["--base", str(run), "--head", str(run)])
    out, err = capsys.readouterr()
    assert status == 0, out[-3000:] + err[-2000:]
    assert "PASS" in out.splitlines()[-1]


def test_every_benchmark_the_suites_produce_has_a_rule():
    """A benchmark no rule fits makes every gate run incomplete: each one in the committed asv metadata (and
    the sample set's) is judged or declared shown-not-judged."""
    for meta_file in (H100 / "benchmarks.json", SOURCE / "benchmarks.json"):
        meta = json.loads(meta_file.read_text())
        missing = [
            name
            for name, info in meta.items()
            if name != "version" and THRESHOLDS.rule_for(name, info.get("unit")) is None
        ]
        assert not missing, f"{meta_file}: no rule in {DEFAULT_PATH} for {missing}"


def test_latency_regression_fails_with_a_table(sets):
    name, i = sets.pick("latency")
    sets.scale(name, i, 1.25)
    rows, status = sets.run()
    assert status == 1
    bad = [r for r in rows if r.verdict == "regression"]
    assert len(bad) == 1 and (bad[0].benchmark, bad[0].params) == (name, _row(rows, sets, name, i).params)
    assert bad[0].ratio == pytest.approx(1.25, rel=1e-9) and bad[0].threshold == pytest.approx(0.10)
    assert {r.verdict for r in rows if r is not bad[0]} <= UNJUDGED


def test_memory_regression_beyond_two_percent_fails(sets):
    name, i = sets.pick("memory")
    sets.scale(name, i, 1.03)  # inside the latency threshold, outside the memory one
    rows, status = sets.run()
    assert status == 1
    assert _row(rows, sets, name, i).verdict == "regression"
    sets.scale(name, i, 1.01)
    rows, status = sets.run()
    assert status == 0 and _row(rows, sets, name, i).verdict == "ok"


def test_latency_change_inside_the_threshold_passes(sets):
    name, i = sets.pick("latency")
    sets.scale(name, i, 1.07)
    rows, status = sets.run()
    assert status == 0
    row = _row(rows, sets, name, i)
    assert row.verdict == "ok" and row.ratio == pytest.approx(1.07)


def test_noise_guard_widens_the_threshold_to_the_measured_spread(sets):
    name, i = sets.pick("latency")
    sets.scale(name, i, 1.15)
    rows, status = sets.run()
    assert (
        status == 1 and _row(rows, sets, name, i).verdict == "regression"
    )  # quiet measurements: 15% is real

    sets.spread(sets.base, name, i, 0.10)  # +-10% interquartile range in both: 15% is inside 2 x 10%
    sets.spread(sets.head, name, i, 0.10)
    rows, status = sets.run()
    row = _row(rows, sets, name, i)
    assert status == 0 and row.verdict == "ok"
    assert row.threshold == pytest.approx(0.20) and "noise" in row.note


def test_noise_guard_reads_the_spread_of_rounds(sets):
    """Head as a folder of two rounds (an interleaved run): value = median, spread = their half range."""
    name, i = sets.pick("latency")
    first, second = copy.deepcopy(sets.head), copy.deepcopy(sets.head)
    sets.set(name, i, sets.value(name, i) * 1.05, data=first)
    sets.set(name, i, sets.value(name, i) * 1.25, data=second)
    sets.write("head", first, "round-1.json")
    folder = sets.write("head", second, "round-2.json")
    base_set = load_result_set(str(sets.write("base", sets.base)))
    head_set = load_result_set(str(folder))
    assert len(head_set.files) == 2
    rows = compare(base_set, head_set, THRESHOLDS)
    row = _row(rows, sets, name, i)
    assert row.ratio == pytest.approx(1.15)  # the median of the two rounds
    assert row.threshold == pytest.approx(2 * 0.10 / 1.15)  # 2 x half range / median
    assert row.verdict == "ok" and exit_status(rows) == 0


def test_noise_guard_reads_the_iqr_reported_beside_a_median(sets):
    """A latency median whose class also reports its IQR (rule iqr_from): a wide IQR widens the threshold."""
    measured = load_result_set(str(sets.file))
    rule = next((r for r in THRESHOLDS.rules if r.metric == "latency" and r.iqr_from), None)
    pairs = [
        (name, [k for k in measured.items if k[0] == name].index((name, combo)))
        for (name, combo), item in measured.items.items()
        if rule
        and THRESHOLDS.rule_for(name, measured.unit(name)) is rule
        and isinstance(item.value, float)
        and isinstance(
            measured.items.get((name.rsplit(".", 1)[0] + "." + rule.iqr_from, combo), item).value, float
        )
        and (name.rsplit(".", 1)[0] + "." + rule.iqr_from, combo) in measured.items
        and not THRESHOLDS.controls.covers(_params(measured, name, combo))
    ]
    if not pairs:
        pytest.skip(f"{SOURCE} has no latency median with an IQR benchmark beside it")
    name, i = pairs[0]
    iqr = name.rsplit(".", 1)[0] + "." + rule.iqr_from
    sets.scale(name, i, 1.15)
    for data in (sets.base, sets.head):  # IQR = 20% of the median: half-width 10%, so 15% is inside 2 x 10%
        data["results"][iqr][sets.cols.index("result")][i] = 0.20 * sets.value(name, i, data)
    rows, status = sets.run()
    row = _row(rows, sets, name, i)
    assert status == 0 and row.verdict == "ok" and row.threshold == pytest.approx(0.20)


def test_a_change_too_noisy_to_judge_is_incomplete(sets):
    """A spread that would allow more than max_noise cannot judge a change beyond the rule's 10%: 'too noisy',
    exit
    2. The same spread around an unchanged value, or one inside 10%, passes: noise never fails a change of
      nothing."""
    name, i = sets.pick("latency")
    sets.spread(sets.head, name, i, 0.30)  # allows 60%, more than max_noise 50%
    rows, status = sets.run()
    assert status == 0 and _row(rows, sets, name, i).verdict == "ok"
    sets.scale(name, i, 1.08)
    sets.spread(sets.head, name, i, 0.30)
    rows, status = sets.run()
    assert status == 0 and _row(rows, sets, name, i).verdict == "ok"
    sets.set(name, i, sets.value(name, i) * 1.2)
    sets.spread(sets.head, name, i, 0.30)
    rows, status = sets.run()
    assert status == 2 and _row(rows, sets, name, i).verdict == "too noisy"


def test_missing_benchmark_or_parameter_is_incomplete(sets):
    name, _ = sets.pick("memory")
    del sets.head["results"][name]
    rows, status = sets.run()
    assert status == 2
    assert set(_verdicts(rows, name).values()) == {"missing"}
    assert {v for (n, _), v in _verdicts(rows).items() if n != name} <= UNJUDGED

    sets.head = copy.deepcopy(sets.base)
    name, i = sets.pick("latency")
    row = sets.head["results"][name]
    params = row[sets.cols.index("params")]
    if not params:
        pytest.skip(f"{name} has no parameters to drop")
    kept = params[-1][:-1]  # drop the last value of the last parameter, as a head that no longer runs it
    width = len(params[-1])
    for col, cells in enumerate(row):
        if sets.cols[col] in ("result",) or (sets.cols[col].startswith("stats_") and cells is not None):
            row[col] = [c for j, c in enumerate(cells) if j % width != width - 1]
    params[-1] = kept
    rows, status = sets.run()
    assert status == 2
    assert (
        sum(v == "missing" for v in _verdicts(rows, name).values())
        == len(sets.base["results"][name][0]) // width
    )


def test_failed_benchmark_is_incomplete(sets):
    name, i = sets.pick("latency")
    sets.set(name, i, None)  # asv: null = this parameter combination failed
    rows, status = sets.run()
    assert status == 2 and _row(rows, sets, name, i).verdict == "failed"

    sets.head = copy.deepcopy(sets.base)
    other, _ = sets.pick("memory")
    sets.head["results"][other][sets.cols.index("result")] = (
        None  # asv: a single null = every combination failed
    )
    rows, status = sets.run()
    assert status == 2 and set(_verdicts(rows, other).values()) == {"failed"}


def test_a_benchmark_that_failed_in_some_rounds_is_incomplete(sets):
    """Head ran in two rounds (two result files of one commit); the benchmark crashed in one: not judged on
    the round that ran."""
    name, i = sets.pick("latency")
    crashed = copy.deepcopy(sets.head)
    sets.set(name, i, None, data=crashed)
    sets.write("head", crashed, filename="round-2.json")
    rows, status = sets.run()
    assert len(load_result_set(str(sets.tmp / "head" / sets.head["params"]["machine"])).files) == 2
    assert status == 2 and _row(rows, sets, name, i).verdict == "failed"


def test_trace_count_any_increase_fails(sets):
    """Dynamo traces of a start (compile.CompileStart.track_dynamo_traces): a warm start that traces once, or
    a cold start that traces twice, has regressed; nothing tolerates one extra trace."""
    name = "compile.CompileStart.track_dynamo_traces"
    sets.meta[name] = {
        **sets.meta.get("compile.CompileStart.track_inductor_compiles", {}),
        "name": name,
        "unit": "traces",
    }
    if THRESHOLDS.rule_for(name, "traces").metric != "trace count":
        pytest.fail(
            f"{name} is judged by rule {THRESHOLDS.rule_for(name, 'traces').metric!r}, not 'trace count'"
        )
    row = copy.deepcopy(sets.base["results"]["compile.CompileStart.track_inductor_compiles"])
    row[sets.cols.index("result")] = [1, 0, 0]  # cold, warm, warm on a new host
    sets.base["results"][name] = row
    for i, traces in ((1, 1), (0, 2)):
        sets.head = copy.deepcopy(sets.base)
        sets.set(name, i, traces)
        rows, status = sets.run()
        assert status == 1 and _row(rows, sets, name, i).verdict == "regression", (i, traces)


def test_skipped_in_head_what_base_measured_is_incomplete(sets):
    name, i = sets.pick("latency")
    sets.set(name, i, float("nan"))  # asv: NaN = skipped (NotImplementedError in setup)
    rows, status = sets.run()
    assert status == 2 and _row(rows, sets, name, i).verdict == "skipped in head"


def test_improvement_is_shown_not_failed(sets):
    from pieceworks.gate.report import markdown

    name, i = sets.pick("latency")
    sets.scale(name, i, 0.5)
    rows, status = sets.run()
    row = _row(rows, sets, name, i)
    assert status == 0 and row.verdict == "improved" and row.ratio == pytest.approx(0.5)
    text = markdown(rows, status, "base", "head")
    shown, folded = text.split("<details>") if "<details>" in text else (text, "")
    assert name in shown and "improved" in shown and "improved" not in folded


def test_new_benchmark_in_head_is_shown_not_gated(sets):
    name, _ = sets.pick("latency")
    sets.head["results"][name + "_new"] = copy.deepcopy(sets.base["results"][name])
    rows, status = sets.run()
    assert status == 0 and set(_verdicts(rows, name + "_new").values()) == {"new"}


def test_compile_count_any_increase_fails(sets):
    col = sets.cols.index("result")
    counts = [
        (n, j)
        for n, row in sets.base["results"].items()
        for j, v in enumerate(row[col] or [])
        if v == 0 and THRESHOLDS.rule_for(n, sets.meta.get(n, {}).get("unit")).metric == "compile count"
    ]
    if not counts:
        pytest.skip(f"{SOURCE} has no compile count of 0 (a warm start)")
    name, i = counts[0]
    sets.set(name, i, 1)
    rows, status = sets.run()
    row = _row(rows, sets, name, i)
    assert status == 1 and row.verdict == "regression" and row.ratio == math.inf


def test_compile_and_capture_time_allow_two_x(sets):
    name, i = sets.pick("compile/capture time")
    sets.scale(name, i, 1.8)
    rows, status = sets.run()
    assert status == 0 and _row(rows, sets, name, i).verdict == "ok"
    sets.scale(name, i, 2.5)
    rows, status = sets.run()
    assert status == 1 and _row(rows, sets, name, i).verdict == "regression"


def test_a_benchmark_no_rule_fits_is_incomplete(sets):
    name, _ = sets.pick("memory")
    sets.meta[name] = {**sets.meta.get(name, {}), "unit": "widgets"}
    rows, status = sets.run()
    assert status == 2 and set(_verdicts(rows, name).values()) == {"no rule"}


def _gate(*args, cwd=REPO):
    return subprocess.run(
        [sys.executable, "-m", "pieceworks.gate", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=120,
    )


def test_command_line_table_markdown_and_exit_status(sets, tmp_path):
    name, i = sets.pick("latency")
    sets.scale(name, i, 1.5)
    base, head = sets.write("base", sets.base), sets.write("head", sets.head)
    md = tmp_path / "comment.md"
    proc = _gate("--base", base, "--head", head, "--markdown", md)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    header = next(line for line in proc.stdout.splitlines() if line.startswith("benchmark"))
    assert header.split() == ["benchmark", "parameter", "base", "head", "ratio", "threshold", "verdict"]
    assert "1.500" in proc.stdout and "regression" in proc.stdout
    comment = md.read_text()
    assert comment.startswith("### Benchmark gate: FAIL: regression")
    assert "| benchmark | parameter | base | head | ratio | threshold | verdict |" in comment


def test_unusable_input_exits_3_naming_the_problem(sets, tmp_path, capfd):
    from pieceworks.gate.__main__ import (
        main,
    )  # in-process: a subprocess per case would import torch each time

    def gate(*args):
        status = main([str(a) for a in args])
        return status, capfd.readouterr().err

    base = sets.write("base", sets.base)
    status, err = gate("--base", base, "--head", tmp_path / "nowhere")
    assert status == 3 and "nowhere: no such file or folder" in err

    bad = tmp_path / "thresholds.json"
    bad.write_text(json.dumps({"rules": [{"metric": "latency", "match": ["*"], "max_ratoi": 1.1}]}))
    status, err = gate("--base", base, "--head", base, "--thresholds", bad)
    assert status == 3 and "max_ratoi" in err

    other = copy.deepcopy(sets.base)
    other["commit_hash"] = "f" * 40
    sets.write("base", other, "ffffffff-" + sets.file.name.split("-", 1)[1])
    status, err = gate("--base", base, "--head", base)
    assert status == 3 and "more than one commit" in err and "@COMMIT" in err
    status, err = gate("--base", f"{base}@{'f' * 8}", "--head", f"{base}@{'f' * 8}")
    assert status == 0, err

    with pytest.raises(SystemExit) as exc:
        main(["--base", str(base)])  # usage errors exit 3 too: 2 means an incomplete comparison
    assert exc.value.code == 3


# ---- drift: implementations whose code no change here touches (thresholds' "controls") ---------------------
def _h100_latency_set(tmp_path: Path, scale, unruled: bool = False) -> tuple:
    """The committed H100 run of the whole suite as base, and a head whose latency medians are scaled by
    `scale(implementation)` (or `scale(implementation, batch)` where it takes two arguments); `unruled`: both
    also hold a benchmark no rule fits (an incomplete comparison, whatever the run's spreads)."""
    source = _fullest_h100_file()
    base = json.loads(source.read_text())
    if unruled:
        base["results"]["probe.Unruled.track_value"] = copy.deepcopy(
            base["results"]["code_size.ReferenceCore.track_lines"]
        )
    head = copy.deepcopy(base)
    cols = base["result_columns"]
    for name, row in head["results"].items():
        if not name.startswith("latency.") or not name.endswith("track_median_us"):
            continue
        params = row[cols.index("params")]
        impls = [str(v).strip("'") for v in params[0]]
        batches = [str(v).strip("'") for v in params[1]]
        per_impl = len(row[cols.index("result")]) // len(impls)
        for i, value in enumerate(row[cols.index("result")]):
            if _is_number(value):
                where = (impls[i // per_impl], batches[i % per_impl])
                row[cols.index("result")][i] = value * scale(*where[: scale.__code__.co_argcount])
    sides = []
    for side, data in (("base", base), ("head", head)):
        folder = tmp_path / side / data["params"]["machine"]
        folder.mkdir(parents=True)
        (tmp_path / side / "benchmarks.json").write_text((H100 / "benchmarks.json").read_text())
        (folder / source.name).write_text(json.dumps(data))
        sides.append(load_result_set(str(folder)))
    rows = compare(*sides, THRESHOLDS)
    latency = [
        r for r in rows if r.benchmark.startswith("latency.") and r.benchmark.endswith("track_median_us")
    ]
    return latency, exit_status(rows)


def _is_control(row) -> bool:
    return (
        "implementation='" in row.params
        and row.params.split("implementation='")[1].split("'")[0] in THRESHOLDS.controls.values
    )


def test_drift_of_the_environment_is_incomplete_not_a_regression(tmp_path):
    """Everything 30% slower, unchanged code included (another load, a slower clock): exit 2, every judged
    latency item whose own threshold is under 30% 'environment drift' naming the controls' move (drift is
    judged per batch size: where the controls' noise allows +30%, so does ours, and such items pass), none a
    regression."""
    rows, status = _h100_latency_set(tmp_path, lambda impl: 1.3)
    judged = [r for r in rows if not _is_control(r) and r.verdict != "too noisy"]
    assert status == 2 and judged and "regression" not in {r.verdict for r in rows}
    tight = [r for r in judged if r.threshold < 0.3]
    assert tight and {r.verdict for r in tight} == {"environment drift"}, {r.verdict for r in tight}
    assert all("+30%" in r.note for r in judged if r.verdict == "environment drift"), judged[0].note
    assert {r.verdict for r in rows if _is_control(r)} == {"control"}


@pytest.mark.parametrize("factor", [1.3, 1.5])
def test_a_regression_of_ours_with_steady_controls_fails(tmp_path, factor):
    """pieceworks slower, the controls unchanged: regressions, exit 1, even beside an item the gate cannot
    judge (a regression is never hidden behind 'incomplete')."""
    rows, status = _h100_latency_set(
        tmp_path, lambda impl: factor if impl.startswith("pieceworks") else 1.0, True
    )
    ours = [
        r for r in rows if "pieceworks" in r.params and r.threshold is not None and r.threshold < factor - 1
    ]
    assert ours and {r.verdict for r in ours} == {
        "regression"
    }  # (a noise-widened threshold above it lets it pass)
    assert "environment drift" not in {r.verdict for r in rows}
    assert status == 1


def test_controls_that_moved_hide_no_improvement_or_regression(tmp_path):
    """Controls 30% faster while ours stayed: the runs cannot be compared (drift), not an improvement of
    nothing or a regression relative to the controls."""
    rows, status = _h100_latency_set(tmp_path, lambda impl: 1.0 if impl.startswith("pieceworks") else 0.7)
    ours = [r for r in rows if "pieceworks" in r.params and r.verdict != "too noisy"]
    assert status == 2 and {r.verdict for r in ours} == {"environment drift"}


def test_a_slow_spell_on_one_batch_size_is_drift_there_not_a_regression(tmp_path):
    """Everything at batch 1 1.6x slower, unchanged code included, the rest unchanged (a slow spell that fell
    on one batch size of the run): batch 1's judged items are 'environment drift', the others untouched, no
    regression."""
    rows, status = _h100_latency_set(tmp_path, lambda impl, batch: 1.6 if batch == "1" else 1.0)
    at_one = [
        r for r in rows if r.params.endswith("batch=1") and not _is_control(r) and r.verdict != "too noisy"
    ]
    assert at_one and {r.verdict for r in at_one} == {"environment drift"}, {r.verdict for r in at_one}
    assert "regression" not in {r.verdict for r in rows} and status == 2
