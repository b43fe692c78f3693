"""The benchmark report (`python -m pieceworks.report`): made from result files only, and honest about them.

- The committed H100 report is exactly what the committed results regenerate (no number edited by hand, and a
  change to the report code shows up as a change to the committed report).
- It says "committed" only of result files git tracks unmodified; a section with no numbers (a CPU machine's
  GPU sections) says "not measured here" and why, never a method text over no table; the project's own checks
  (the core's size) stand apart from the product targets.
- A missed ratio is explained by both of its sides: their kernel time, GPU busy share and the kernels only the
  slower side runs, from the latency run's own profiles; where that run did not profile both, the note says
  so.
- A benchmark this machine cannot run (two GPUs) names the machine that measured it at the same commit, and
  no machine that measured another.
- Of the runtime breakdowns, only the newest by its recorded date is read; the targets, their
  limits and labels are those of the thresholds file.
- Every asv benchmark the report reads (its one table, `pieceworks.report.benchmarks`) exists in
  suites/benchmarks: renaming one fails here, not silently in an empty section.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pieceworks import report
from pieceworks.gate.results import result_files
from pieceworks.report import serving as report_serving
from pieceworks.report.benchmarks import BENCHMARKS, TRACKS

REPO = Path(__file__).resolve().parent.parent
MACHINE = "nvidia-h100-80gb-hbm3"
# H100 results of every section, as one commit's (its README)
SAMPLE = REPO / "suites" / "data" / "report_sample"


def _scale_asv(results: Path, scale: dict[tuple[str, tuple], float]) -> None:
    """Multiply values of the copied asv runs, each in the run the report reads it from (the newest that has
    it): `{(benchmark, params): factor}`."""
    for (name, key), factor in scale.items():
        docs = {path: json.loads(path.read_text()) for path in (results / "asv" / MACHINE).glob("*-*.json")}
        path, doc = max(
            ((p, d) for p, d in docs.items() if name in d["results"]),
            key=lambda found: found[1]["results"][name][3],
        )
        row = dict(zip(doc["result_columns"], doc["results"][name]))
        keys = list(itertools.product(*[[ast.literal_eval(p) for p in ps] for ps in row["params"]]))
        row["result"][keys.index(key)] *= factor
        path.write_text(json.dumps(doc))


def _regenerate(
    tmp_path: Path,
    drop: tuple[str, ...] = (),
    one_side: bool = False,
    scale: dict[tuple[str, tuple], float] | None = None,
    plots: bool = False,
    source: Path = SAMPLE,
) -> str:
    """The report of a copy of `source`'s results, without the files matching `drop`; `one_side`: the latency
    runs' profiles of reduce-overhead removed (one side of the FULL ratio unprofiled); `scale`: asv values
    multiplied (see `_scale_asv`), to force a target's verdict whatever the committed run measured."""
    results = tmp_path / "results"
    shutil.copytree(source / "asv", results / "asv")
    shutil.copytree(
        source / "bench" / MACHINE,
        results / "bench" / MACHINE,
        ignore=shutil.ignore_patterns("plots", "REPORT.md", *drop),
    )
    for path in (results / "bench" / MACHINE).glob("latency_toy_llama_*.json") if one_side else ():
        doc = json.loads(path.read_text())
        doc["profiles"] = {k: v for k, v in doc["profiles"].items() if not k.startswith("reduce-overhead|")}
        path.write_text(json.dumps(doc))
    _scale_asv(results, scale or {})
    assert (
        report.main(["--results", str(results), "--machine", MACHINE] + ([] if plots else ["--no-plots"]))
        == 0
    )
    return (results / "bench" / MACHINE / "REPORT.md").read_text()


# FULL made 2x slower at bfloat16 batch 64, a size whose both sides the committed latency run profiled: the
# worst miss, whatever the committed run measured.
FULL_MISS = {("latency.ToyLlamaBfloat16.track_median_us", ("pieceworks-full", 64)): 2.0}


def _git(folder: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            "git",
            "-C",
            str(folder),
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "commit.gpgsign=false",
            *args,
        ],
        capture_output=True,
        text=True,
        check=True,
    )


def _commit(folder: Path) -> None:
    """`folder` made a git repository with everything in it committed."""
    _git(folder, "init", "-q")
    _git(folder, "add", "-A")
    _git(folder, "commit", "-q", "-m", "results")


def _report(results: Path, machine: str = MACHINE) -> str:
    assert report.main(["--results", str(results), "--machine", machine, "--no-plots"]) == 0
    return (results / "bench" / machine / "REPORT.md").read_text()


def test_the_committed_report_is_what_the_committed_results_regenerate(tmp_path):
    committed = (REPO / "results" / "bench" / MACHINE / "REPORT.md").read_text()
    _regenerate(tmp_path, source=REPO / "results")
    _commit(tmp_path / "results")  # a clone's committed files, as in the repository
    assert report.main(["--results", str(tmp_path / "results"), "--machine", MACHINE]) == 0
    assert (tmp_path / "results" / "bench" / MACHINE / "REPORT.md").read_text() == committed, (
        "results/bench/<machine>/REPORT.md differs from what its result files give: regenerate it with "
        "`python -m pieceworks.report --machine <machine>` and commit it"
    )
    linked = {
        line[line.index("(plots/") + 7 : -1] for line in committed.splitlines() if line.startswith("![")
    }
    written = {p.name for p in (tmp_path / "results" / "bench" / MACHINE / "plots").glob("*.png")}
    assert linked
    if importlib.util.find_spec("matplotlib") is not None:  # the `bench` extra; without it, tables only
        assert linked == written
    else:
        assert not written


def _full_target(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("| FULL ≤ 1.02× reduce-overhead"))


def test_a_miss_is_explained_by_both_sides_and_the_kernels_only_one_runs(tmp_path):
    row = _full_target(_regenerate(tmp_path, scale=FULL_MISS))
    assert "**missed**" in row
    assert "bfloat16 b64: pieceworks-full " in row and " vs reduce-overhead " in row
    assert row.count("% busy") >= 2 and "kernels only in pieceworks-full: `" in row

    one_side = _full_target(_regenerate(tmp_path / "one_side", one_side=True, scale=FULL_MISS))
    assert "**missed**" in one_side and "bfloat16 b64: no kernel profile of both sides recorded" in one_side
    assert " vs reduce-overhead " not in one_side


def _warm_start_report(tmp_path: Path, breakdown: bool) -> tuple[str, float]:
    """The report with warm and new-host first calls forced to 10x what was measured (a miss whatever the
    committed run measured), the compile details given a breakdown of 75% trace, 5% split, 20% load (or none);
    and the warm first call's seconds."""
    name = "compile.CompileStart.track_first_call_seconds"
    _regenerate(tmp_path, scale={(name, ("warm",)): 10.0, (name, ("warm_new_host",)): 10.0})
    results = tmp_path / "results"
    first_call = {start[0]: v for start, v in report.load_results(str(results), MACHINE).asv[name].items()}
    details = results / "bench" / MACHINE / "compile.json"
    doc = json.loads(details.read_text())
    for start, entry in doc["entries"].items():
        for key in ("trace_seconds", "split_seconds", "load_seconds", "compile_seconds"):
            entry.pop(key, None)
        entry.pop("first_call_profile", None)
        if breakdown:
            entry.update(
                first_call_seconds=first_call[start],
                trace_seconds=0.75 * first_call[start],
                split_seconds=0.05 * first_call[start],
                load_seconds=0.2 * first_call[start],
                compile_seconds=0.0,
                first_call_profile={
                    "seconds": 6.0,
                    "top": [
                        {
                            "function": "codecache.py:730(torch_key)",
                            "calls": 1,
                            "tottime_s": 0.5,
                            "cumtime_s": 0.6,
                        }
                    ],
                    # as a details file holds them: keys sorted by name
                    "owners": {
                        "a": 0.3,
                        "b": 0.3,
                        "c": 0.3,
                        "d": 0.3,
                        "pieceworks": 0.05,
                        "torch._inductor": 0.9,
                        "torch.fx": 0.4,
                    },
                },
                log=["pieceworks: config field x changed: tracing", "a | b\n  c"],
            )
    details.write_text(json.dumps(doc))
    assert report.main(["--results", str(results), "--machine", MACHINE, "--no-plots"]) == 0
    return (results / "bench" / MACHINE / "REPORT.md").read_text(), first_call["warm"]


@pytest.mark.parametrize("same_commit", [True, False])
def test_pytest_benchmarks_file_is_read_by_the_commit_it_records(tmp_path, same_commit):
    """pytest-benchmark's host_overhead.json records its commit in its own `commit_info`, not in an
    environment: read where that is the report's commit, left out (and counted) where it is another's."""
    _regenerate(tmp_path)
    path = tmp_path / "results" / "bench" / MACHINE / "host_overhead.json"
    doc = json.loads(path.read_text())
    doc.pop("environment", None)
    doc["commit_info"]["id"] = SAMPLE_COMMIT if same_commit else "0def5670" * 5
    path.write_text(json.dumps(doc))
    text = _report(tmp_path / "results")
    assert ("pytest-benchmark (`suites/test_host_overhead.py`)" in text) == same_commit
    assert ("(1 result files of other commits, or recording none, are left out)" in text) != same_commit


def test_the_host_overhead_per_piece_shows_its_range_over_rounds(tmp_path):
    """One number from runs that differ 7x on a shared machine says nothing: a row that recorded its
    overhead per piece's range over rounds shows it beside the median; one from before shows the median."""
    _regenerate(tmp_path)
    path = tmp_path / "results" / "bench" / MACHINE / "host_overhead.json"
    doc = json.loads(path.read_text())
    doc["commit_info"]["id"] = SAMPLE_COMMIT
    rows = [b for b in doc["benchmarks"] if "mode" in b.get("extra_info", {})]
    rows[0]["extra_info"].update(overhead_per_piece_us=0.85, overhead_per_piece_range_us=[0.8, 5.93])
    rows[1]["extra_info"].pop("overhead_per_piece_range_us", None)
    path.write_text(json.dumps(doc))
    text = _report(tmp_path / "results")
    assert "| 0.85 (0.80-5.93) |" in text, text
    assert f"| {rows[1]['extra_info']['overhead_per_piece_us']:.2f} |" in text


def test_the_pytest_benchmarks_file_is_read_by_the_commit_it_measured(tmp_path):
    """A tree measured at another checkout ($PIECEWORKS_COMMIT, as every details file records it): the commit
    the suite wrote beside pytest-benchmark's own `commit_info` (git's HEAD) is the one the report reads."""
    _regenerate(tmp_path)
    path = tmp_path / "results" / "bench" / MACHINE / "host_overhead.json"
    doc = json.loads(path.read_text())
    doc.update(commit=SAMPLE_COMMIT[:7], commit_info={**doc["commit_info"], "id": "0def5670" * 5})
    path.write_text(json.dumps(doc))
    text = _report(tmp_path / "results")
    assert f"pytest-benchmark (`suites/test_host_overhead.py`), {doc['datetime'][:19]} UTC, commit " in text
    assert "left out" not in text


def test_the_suite_records_the_measured_commit_in_pytest_benchmarks_file(request, monkeypatch):
    """`--benchmark-json` gets the measured code's commit ($PIECEWORKS_COMMIT where set), not only git's: the
    hook suites/conftest.py registers, called as pytest-benchmark calls it before writing the file."""
    monkeypatch.setenv("PIECEWORKS_COMMIT", "ed2b9ffb7901dadee7755db223617f66d2fbb24b")
    output: dict = {"commit_info": {"id": "02788ac5d6f3626def21637413e6254ab861f788"}}
    request.config.hook.pytest_benchmark_update_json(config=request.config, benchmarks=[], output_json=output)
    assert output["commit"] == "ed2b9ff"


def test_a_negative_host_overhead_per_piece_is_shown_and_not_judged(tmp_path):
    """The overhead is a forward less its pieces timed alone: below zero the subtraction resolves nothing, and
    a negative number under a limit is no evidence that the limit is met."""
    _regenerate(tmp_path)
    path = tmp_path / "results" / "bench" / MACHINE / "host_overhead.json"
    doc = json.loads(path.read_text())
    doc["commit_info"]["id"] = SAMPLE_COMMIT
    rows = [b for b in doc["benchmarks"] if b.get("extra_info", {}).get("mode") == "PIECEWISE"]
    for b in rows:
        b["extra_info"]["overhead_per_piece_us"] = -4.74
    path.write_text(json.dumps(doc))
    text = _report(tmp_path / "results")
    row = next(line for line in text.splitlines() if line.startswith("| host overhead ≤ 2 µs per piece"))
    assert "| unresolved |" in row and "resolves no overhead" in row and "-4.74 µs" in row, row
    rows[0]["extra_info"]["overhead_per_piece_us"] = 0.5
    path.write_text(json.dumps(doc))
    text = _report(tmp_path / "results")
    row = next(line for line in text.splitlines() if line.startswith("| host overhead ≤ 2 µs per piece"))
    assert f"b{rows[0]['extra_info']['batch']}: 0.50 µs" in row and "| met |" in row, row
    assert "not judged: " in row and "-4.74 µs" in row, row


def test_a_partial_serving_run_says_so(tmp_path):
    """A serving run stopped by its time limit (its details written after each phase, `partial` naming the
    last) is shown as partial; a whole one is not."""
    _regenerate(tmp_path, source=REPO / "results")
    path = tmp_path / "results" / "bench" / MACHINE / "serving_llama_1b_unified.json"
    assert "A partial run" not in _report(tmp_path / "results")
    doc = json.loads(path.read_text())
    path.write_text(json.dumps({**doc, "partial": "stopped after steps"}))
    assert "A partial run (stopped after steps: its time limit)" in _report(tmp_path / "results")


def test_serving_misses_carry_their_profiles(tmp_path):
    """An attention op over its host-time target is explained by its cProfile's own time a call (100 calls
    profiled), a PIECEWISE capture over its target by the capture's profile from the memory run."""
    _regenerate(tmp_path, source=REPO / "results")
    path = tmp_path / "results" / "bench" / MACHINE / "serving_llama_1b_unified.json"
    doc = json.loads(path.read_text())
    doc["attention_host_us"]["decode b1"]["median_us"] = 100.0
    doc["builds"]["pieceworks-piecewise"]["capture_ms_per_size"] = 100.0
    path.write_text(json.dumps(doc))
    text = _report(tmp_path / "results")
    top, calls = doc["attention_host_profile"]["top"][0], doc["attention_host_profile"].get("op_calls", 100)
    assert (
        f"llama_1b, unified attention, {calls} calls under cProfile, own time a call: `{top['function']}` "
        f"{1e6 * top['tottime_s'] / calls:.1f} µs in {top['calls'] / calls:g} calls"
    ) in _line(text, "| attention op host time")
    row = _line(text, "| PIECEWISE capture ≤ 25 ms per size")
    assert "**missed**" in row and "llama_1b PIECEWISE: " in row and " ms a size); under cProfile (" in row


def test_capture_misses_are_explained_by_the_worst_miss_a_memory_run_profiled(tmp_path):
    """The capture targets judge PIECEWISE and FULL_AND_PIECEWISE of the 1B and the whole 8B in every serving
    run; a miss is explained by the memory run's capture profile of its model and mode, the worst such: the
    committed 8B's misses are worse, but no memory run measured the whole 8B."""
    _regenerate(tmp_path, source=REPO / "results")
    path = tmp_path / "results" / "bench" / MACHINE / "memory_llama_1b.json"
    doc = json.loads(path.read_text())  # a memory run of FULL_AND_PIECEWISE too: PIECEWISE's readings
    entries = doc["entries"]
    entries |= {f"FULL_AND_{k}": v for k, v in list(entries.items()) if k.startswith("PIECEWISE|")}
    doc["capture_profiles"]["FULL_AND_PIECEWISE"] = doc["capture_profiles"]["PIECEWISE"]
    path.write_text(json.dumps(doc))
    text = _report(tmp_path / "results")
    for mode, limit in (("PIECEWISE", 25), ("FULL_AND_PIECEWISE", 35)):
        row = _line(text, f"| {mode} capture ≤ {limit} ms per size (1B and 8B, 51 sizes)")
        assert "llama_8b, unified attention: " in row and "**missed**" in row
        assert f"llama_1b {mode}: " in row and " ms a size); under cProfile (" in row


def test_a_serving_target_notes_the_worst_miss_of_each_profile():
    """A serving target's note gives its worst explained misses, one per note: the same model's miss with the
    other attention (the same capture profile) leaves its place to the next model's, whose miss is then
    explained too; a miss with no note gives none."""
    found = [
        ("8b u", 65.0, "8b"),
        ("8b v", 48.0, "8b"),
        ("1b u", 30.0, "1b"),
        ("x", 90.0, ""),
        ("ok", 20.0, "n"),
    ]
    assert report_serving.worst_explained(found, 25.0) == [("8b u", 65.0, "8b"), ("1b u", 30.0, "1b")]
    assert report_serving.worst_explained(found, 25.0, count=1) == [("8b u", 65.0, "8b")]


def _trace(**tokens: list[float]) -> dict:
    """A serving run's trace entries: {mode: per-round tokens/s} of the decode and the mixed trace."""
    return {
        f"pieceworks-{mode}|{trace} trace": {"tokens_per_s": sum(r) / len(r), "round_tokens_per_s": r}
        for key, r in tokens.items()
        for mode, trace in [key.rsplit("_", 1)]
    }


def test_the_report_answers_which_mode_to_serve_with():
    """Per model and attention: each trace's modes that serve alike (within 1% of the best's tokens/s in some
    round), and the mode to serve with, alike on both traces; where none is, each trace's best. Then the
    field's published figures, marked as theirs, beside ours of the same kind."""
    entries = _trace(
        full_decode=[100.0, 100.0],
        full_and_piecewise_decode=[99.0, 99.6],  # 99.0-99.6% of FULL's: alike
        piecewise_decode=[96.0, 96.0],
        full_mixed=[190.0, 190.0],
        full_and_piecewise_mixed=[200.0, 200.0],
        piecewise_mixed=[199.0, 199.0],
    )
    runs = {
        ("m", "unified"): {"entries": entries},
        ("n", "varlen"): {"entries": _trace(piecewise_decode=[1.0])},
    }
    text = "\n".join(report_serving.which_mode_summary(runs).lines)
    decode, mixed = "FULL 100.0%, FULL_AND_PIECEWISE 99.3%", "FULL_AND_PIECEWISE 100.0%, PIECEWISE 99.5%"
    assert f"| m, unified | {decode} | {mixed} | FULL_AND_PIECEWISE |" in text
    assert "| n, varlen | PIECEWISE 100.0% | n/a | decode: PIECEWISE |" in text
    decoded = entries["pieceworks-full_and_piecewise|decode trace"]
    decoded["round_tokens_per_s"] = [98.0, 98.5]  # no longer alike
    text = "\n".join(report_serving.which_mode_summary(runs).lines)
    assert f"| m, unified | FULL 100.0% | {mixed} | decode: FULL; mixed: FULL_AND_PIECEWISE |" in text
    qwen = "| Qwen2.5-1.5B: piecewise over full | 1.07-1.08× | vLLM PR 20059 | PIECEWISE / FULL: "
    assert qwen + "m, unified: 1.04× (1.04-1.04)" in text
    assert "Published figures (theirs, measured elsewhere)" in text


def test_the_header_says_what_host_times_ran_on(tmp_path):
    """The host the run recorded (usable of all logical CPUs, CPU model, load average at the start, GPUs
    visible) heads the report: host-bound times (eager steps, host µs) mean little without it."""
    _regenerate(tmp_path)
    path = tmp_path / "results" / "bench" / MACHINE / "environment.json"
    doc = json.loads(path.read_text())
    doc["environment"]["host"] = {
        "cpu_model": "Some CPU",
        "cpus_usable": 16,
        "cpus": 64,
        "load_average": 31.5,
        "gpus_visible": 1,
    }
    path.write_text(json.dumps(doc))
    assert (
        "- host: 16 of 64 logical CPUs usable (Some CPU), load average 31.5 at the start, 1 GPU visible\n"
        in _report(tmp_path / "results")
    )


def test_start_up_is_also_given_above_the_floor(tmp_path):
    """The floor (a process importing torch and pieceworks) recorded beside the starts: each start's process
    seconds above it, and that over cold's; no floor recorded, no such line."""
    text = _regenerate(tmp_path)
    assert "Floor (" not in text
    details = tmp_path / "results" / "bench" / MACHINE / "compile.json"
    doc = json.loads(details.read_text())
    doc["entries"]["floor"] = {"process_seconds": 1.5}
    details.write_text(json.dumps(doc))
    text = _report(tmp_path / "results")
    process = {s: doc["entries"][s]["process_seconds"] for s in ("cold", "warm")}
    line = _line(text, "Floor (a fresh process importing torch and pieceworks): 1.50 s.")
    assert f"cold {process['cold'] - 1.5:.2f} s (1.00× cold's)" in line
    assert (
        f"warm {process['warm'] - 1.5:.2f} s "
        f"({(process['warm'] - 1.5) / (process['cold'] - 1.5):.2f}× cold's)" in line
    )


@pytest.mark.parametrize(
    "detail, cls, title",
    [
        ("compile_llama_1b", "CompileStartLlama1B", "Llama-3.2-1B's shape (bfloat16)"),
        (
            "compile_user_model",
            "CompileStartUserModel",
            "User's model hf_tiny_qwen3 (a Hugging Face config.json)",
        ),
    ],
)
def test_each_started_model_has_its_own_table_from_its_own_results(tmp_path, detail, cls, title):
    """A model's starts (its own asv class and details file) make a table and a target row of their own:
    copies of ToyLlama's results renamed and scaled, warm at 0.05× cold. Without them the model says "not
    measured"."""
    text = _regenerate(tmp_path / "before")
    assert (
        f"## Start-up: cold, warm, warm on a new host: {title.replace(' hf_tiny_qwen3', '')}\n\nNot measured"
        in text
    )
    _regenerate(tmp_path)
    results = tmp_path / "results"
    bench = results / "bench" / MACHINE
    doc = json.loads((bench / "compile.json").read_text())
    (bench / f"{detail}.json").write_text(
        json.dumps({**doc, "model": detail.removeprefix("compile_").replace("user_model", "hf_tiny_qwen3")})
    )
    for path in (results / "asv" / MACHINE).glob("*-*.json"):
        run = json.loads(path.read_text())
        for name in [n for n in run["results"] if n.startswith("compile.CompileStart.")]:
            row = dict(zip(run["result_columns"], run["results"][name]))
            starts = [ast.literal_eval(p) for p in row["params"][0]]
            values = dict(zip(starts, (7 * v for v in row["result"])))
            if name.endswith("first_call_seconds"):
                values["warm"] = 0.05 * values["cold"]
            copy = {**row, "result": [values[s] for s in starts]}
            run["results"][name.replace("CompileStart.", f"{cls}.")] = [
                copy.get(c) for c in run["result_columns"]
            ]
        path.write_text(json.dumps(run))
    text = _report(results)
    table = text[text.index(f"## Start-up: cold, warm, warm on a new host: {title}") :]
    cold = report.load_results(str(results), MACHINE).asv[f"compile.{cls}.track_first_call_seconds"]
    assert _line(table, "| cold |").startswith(f"| cold | {cold[('cold',)]:.2f} | 1.00 |")
    assert _line(table, "| warm |").startswith(f"| warm | {cold[('warm',)]:.2f} | 0.05 |")
    assert "warm: 0.05× cold" in _line(
        text, f"| warm start: 0 Inductor compiles, 0 traces, ≤ 10% of cold (also new host; {title}"
    )


def _line(text: str, start: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(start))


def test_start_up_tables_read_the_details_file_where_asv_recorded_no_run(tmp_path):
    """A run made without asv (a copy of the tree with no git history) leaves only the details file: the
    start-up table shows its numbers, as the asv tracks would have, not "not measured"."""
    with_asv = _line(_regenerate(tmp_path / "asv"), "| warm |")
    results = tmp_path / "details" / "results"
    _regenerate(tmp_path / "details")
    for path in (results / "asv" / MACHINE).glob("*-*.json"):
        doc = json.loads(path.read_text())
        doc["results"] = {k: v for k, v in doc["results"].items() if not k.startswith("compile.")}
        path.write_text(json.dumps(doc))
    assert report.main(["--results", str(results), "--machine", MACHINE, "--no-plots"]) == 0
    assert _line((results / "bench" / MACHINE / "REPORT.md").read_text(), "| warm |") == with_asv


def test_a_warm_start_miss_says_where_the_first_call_went(tmp_path):
    """With the compile benchmark's breakdown recorded (trace, split, load, compile), the compile table shows
    it and a missed warm-start target is split into those parts; without it, n/a."""
    text, warm = _warm_start_report(tmp_path, breakdown=True)
    row = _line(text, "| warm start:")
    assert "**missed**" in row
    assert (
        f"warm: {warm:.2f} s = trace {0.75 * warm:.2f} + split {0.05 * warm:.2f} + load {0.2 * warm:.2f} + "
        "compile 0.00 s; under cProfile (6.00 s), own time: `codecache.py:730(torch_key)` 0.50 s in 1 calls; "
        "own time by whose code runs: torch._inductor 0.90 s, torch.fx 0.40 s, a 0.30 s, b 0.30 s, c 0.30 s, "
        f"d 0.30 s, pieceworks 0.05 s; without pieceworks' own time (1% of the profile): "
        f"{warm * (1 - 0.05 / 6.0):.2f} s; "
        'pieceworks logged: "pieceworks: config field x changed: tracing" / "a \\| b c"'
    ) in row
    assert f"| {0.75 * warm:.2f} | {0.05 * warm:.2f} | {0.2 * warm:.2f} | 0.00 |" in _line(text, "| warm |")

    text, warm = _warm_start_report(tmp_path / "without", breakdown=False)
    assert "**missed**" in _line(text, "| warm start:") and "= trace" not in _line(text, "| warm start:")
    row = _line(text, "| warm |")
    assert f"| {warm:.2f} | " in row and "0.00 |" not in row  # no breakdown recorded: no such columns


def test_a_pool_miss_says_how_the_pool_grows_with_the_sizes(tmp_path):
    """The pool of 51 sizes forced to twice what was measured (a miss): its row says the pool for the largest
    size, 8 sizes and 51, and the pools of one per size."""
    name = "memory.CaptureMemory.track_{}"
    text = _regenerate(tmp_path, scale={(name.format("pool_mib"), ("PIECEWISE", 51)): 2.0})
    found = report.load_results(str(tmp_path / "results"), MACHINE).asv
    pools = [found[name.format("pool_mib")][("PIECEWISE", n)] for n in (1, 8, 51)]
    unshared = found[name.format("unshared_pool_mib")][("PIECEWISE", 51)]
    row = _line(text, "| pool for 51 sizes")
    assert "**missed**" in row
    assert (
        f"ToyLlama 12 layers PIECEWISE: pool {pools[0]:.1f} MiB for the largest size, {pools[1]:.1f} for 8 "
        f"sizes, {pools[2]:.1f} for 51 (a pool per size: {unshared:.1f})"
    ) in row


def test_a_capture_miss_says_what_the_first_size_and_each_further_graph_cost(tmp_path):
    """A capture miss says what the first size and each further graph cost; with the capture's cProfile,
    where its host time went, by whose code, and what a size's capture would cost were pieceworks' own code
    free (its share of the profile taken out): a miss that remains is the rest of the code's."""
    name = "memory.CaptureMemory.track_capture_seconds"
    text = _regenerate(tmp_path, scale={(name, ("PIECEWISE", 51)): 100.0})  # a miss, whatever was measured
    entries = json.loads((SAMPLE / "bench" / MACHINE / "memory.json").read_text())["entries"]
    one, all_ = entries["PIECEWISE|1"], entries["PIECEWISE|51"]
    per_graph = (all_["capture_seconds"] - one["capture_seconds"]) / (all_["graphs"] - one["graphs"])
    row = _line(text, "| capture of 51 sizes")
    assert "**missed**" in row
    assert (
        f"PIECEWISE: {all_['graphs']} graphs; 1 size ({one['graphs']} graphs) {one['capture_seconds']:.2f} "
        f"s, then {1e3 * per_graph:.2f} ms a graph"
    ) in row

    # with the capture phase's cProfile in the details, the note names where its host time went
    results = tmp_path / "results"
    details = results / "bench" / MACHINE / "memory.json"
    doc = json.loads(details.read_text())
    doc["capture_profiles"] = {
        "PIECEWISE": {
            "seconds": 2.5,
            "top": [
                {
                    "function": "<method 'capture_end' of 'torch._C._CUDAGraph' objects>",
                    "calls": 663,
                    "tottime_s": 0.9,
                    "cumtime_s": 0.9,
                }
            ],
            "owners": {"pieceworks": 0.5, "torch.cuda": 1.0},
        }
    }
    details.write_text(json.dumps(doc))
    assert report.main(["--results", str(results), "--machine", MACHINE, "--no-plots"]) == 0
    row = _line((results / "bench" / MACHINE / "REPORT.md").read_text(), "| capture of 51 sizes")
    per_size = 1e3 * all_["capture_seconds"] / 51
    profile = "`<method 'capture_end' of 'torch._C._CUDAGraph' objects>` 0.90 s in 663 calls"
    owners = "torch.cuda 1.00 s, pieceworks 0.50 s"
    assert (
        f"ms a graph; 51 sizes {all_['capture_seconds']:.2f} s ({per_size:.1f} ms a size); under cProfile "
        f"(2.50 s), own time: {profile}; own time by whose code runs: {owners}; without pieceworks' own time "
        f"(20% of the profile): {per_size * 0.8:.1f} ms a size"
    ) in row


SIDE_BY_SIDE = [
    "compiled call",
    "plan run",
    "graph replays",
    "splitting ops",
    "FULL",
    "FULL unsplit",
    "meta-pcg",
    "reduce-overhead",
]  # the variants of a runtime breakdown, in the order it times them


SAMPLE_COMMIT = json.loads((SAMPLE / "bench" / MACHINE / "environment.json").read_text())["environment"][
    "commit"
]


def _side_by_side_run(
    folder: Path,
    label: str,
    full: float,
    unsplit: float,
    pcg: float,
    date: str = "2026-11-23T00:00:00+00:00",
    commit: str = SAMPLE_COMMIT[:7],
) -> Path:
    """A runtime_breakdown result `label` of `commit` and `date` with one dtype and one batch: the given
    ratios, each over 3 rounds."""
    ratio = lambda m: {"median": m, "min": m - 0.01, "max": m + 0.02, "rounds": 3}  # noqa: E731 - a one-line helper
    us = {name: {"median_us": 100.0, "p25_us": 99.0, "p75_us": 101.0} for name in SIDE_BY_SIDE}
    doc = {
        "device": "GPU",
        "torch": "2.x",
        "date": date,
        "model": "ToyLlama",
        "reps": 30,
        "commit": commit,
        "dtypes": {
            "bfloat16": {
                "batches": {
                    "64": {
                        "us": us,
                        "ratios": {
                            "PIECEWISE / meta-pcg": ratio(pcg),
                            "FULL / reduce-overhead": ratio(full),
                            "FULL unsplit / reduce-overhead": ratio(unsplit),
                            "compiled call / plan run": ratio(1.01),
                        },
                    }
                }
            }
        },
    }
    (path := folder / f"runtime_breakdown_{label}.json").write_text(json.dumps(doc))
    return path


def _side_by_side_row(text: str, batch: int) -> str:
    return _line(text[text.index("## Side by side") :], f"| {batch} |")


def test_the_newest_side_by_side_run_gets_a_table_of_its_rounds_and_the_call_over_plan_row(tmp_path):
    """The newest runtime breakdown (`runtime_breakdown_<commit>.json`, by its recorded date) gets a table of
    its variants and of every ratio it timed, each the median of its per-round ratios with their range (FULL
    unsplit beside FULL: what the split costs); of those ratios only the call over its plan run is a target
    row of its own, PIECEWISE / pcg and FULL being the latency rows'."""
    text = _regenerate(tmp_path, drop=("runtime_breakdown_*",))
    assert "side by side (rounds)" not in text
    folder = tmp_path / "results" / "bench" / MACHINE
    _side_by_side_run(folder, "abc1234", full=1.12, unsplit=1.0, pcg=0.8)
    text = _report(tmp_path / "results")
    assert f"commit {SAMPLE_COMMIT[:7]}, 2026-11-23" in text and "### bfloat16" in text
    row = _side_by_side_row(text, 64)
    assert (
        "| 0.800× (0.790-0.820) | 1.120× (1.110-1.140) | 1.000× (0.990-1.020) | 1.010× (1.000-1.030) |" in row
    )
    call = _line(text, "| CompiledModel call ≤ 1.03× its plan run, side by side (rounds)")
    assert "| bfloat16 b64: 1.01× (1.00-1.03) | met |" in call
    assert "Meta pcg, side by side" not in text and "reduce-overhead, side by side" not in text
    # a later run of the same commit, its file name sorting first: only it is read
    _side_by_side_run(folder, "0-later", full=1.12, unsplit=1.10, pcg=0.8, date="2026-11-24T00:00:00+00:00")
    text = _report(tmp_path / "results")
    assert f"commit {SAMPLE_COMMIT[:7]}, 2026-11-24" in text and "2026-11-23" not in text
    assert "| 1.120× (1.110-1.140) | 1.100× (1.090-1.120) |" in _side_by_side_row(text, 64)
    # a run of another commit: left out, counted
    _side_by_side_run(folder, "other", full=3.0, unsplit=3.0, pcg=3.0, commit="0def567")
    text = _report(tmp_path / "results")
    assert "0def567" not in text and "3.000×" not in text and "(1 result files of other commits" in text


def test_a_call_over_plan_miss_names_what_the_call_adds_under_cprofile(tmp_path):
    """A runtime breakdown whose compiled call misses its plan run, with a `call_profile`, gets the functions
    whose own time the call adds in the target row's note."""
    _regenerate(tmp_path, drop=("runtime_breakdown_*",))
    path = _side_by_side_run(
        tmp_path / "results" / "bench" / MACHINE, "abc1234", full=1.0, unsplit=1.0, pcg=0.8
    )
    doc = json.loads(path.read_text())
    result = doc["dtypes"]["bfloat16"]
    result["batches"]["64"]["ratios"]["compiled call / plan run"] = {
        "median": 1.2,
        "min": 1.1,
        "max": 1.3,
        "rounds": 3,
    }
    result["call_profile"] = {
        "batch": 1,
        "calls": 100,
        "seconds": {"compiled call": 0.061, "plan run": 0.048},
        "added": [{"function": "reference/api.py:200(_check)", "us_per_call": 12.5, "calls_per_call": 1.0}],
    }
    path.write_text(json.dumps(doc))
    row = _line(_report(tmp_path / "results"), "| CompiledModel call ≤ 1.03× its plan run, side by side")
    assert "| bfloat16 b64: 1.20× (1.10-1.30) | **missed** |" in row
    assert (
        "bfloat16 b1 under cProfile (100 calls each, profiler overhead included): call 61 ms vs plan 48 ms, "
        "own time the call adds per forward: `reference/api.py:200(_check)` 12.5 µs in 1 calls"
    ) in row


def test_latency_ratios_come_from_the_rounds_where_the_run_timed_side_by_side(tmp_path):
    """A latency run that timed both sides of a target ratio in rotating rounds gives the table and the target
    row the median of its per-round ratios, with their range; not one median over the other, which a slow
    spell of the host during one implementation's turn moves."""
    _regenerate(tmp_path)
    results = tmp_path / "results"
    details = results / "bench" / MACHINE / "latency_toy_llama_bfloat16.json"
    doc = json.loads(details.read_text())
    doc.update(
        rounds=10,
        side_by_side=["pieceworks-full", "reduce-overhead"],
        ratios={
            "64": {"FULL / reduce-overhead": {"median": 1.5, "min": 1.4, "max": 1.6, "rounds": 10}},
            "512": {"FULL / reduce-overhead": {"median": 0.5, "min": 0.45, "max": 0.55, "rounds": 10}},
        },
    )
    details.write_text(json.dumps(doc))
    assert report.main(["--results", str(results), "--machine", MACHINE, "--no-plots"]) == 0
    text = (results / "bench" / MACHINE / "REPORT.md").read_text()
    table = text[text.index("### toy_llama, bfloat16") :]
    assert _line(table, "| 64 |").endswith("| 1.50× (1.40-1.60) |")
    assert _line(table, "| 512 |").endswith("| 0.50× (0.45-0.55) |")
    assert "Timed side by side in 10 rotating rounds: pieceworks-full, reduce-overhead" in table
    row = _full_target(text)
    assert "bfloat16 b64: 1.50× (1.40-1.60)" in row and "bfloat16 b512: 0.50× (0.45-0.55)" in row
    assert "**missed**" in row and "bfloat16 b64:" in row.split("|")[4]


def test_a_latency_target_judges_its_models_from_its_smallest_batch(tmp_path):
    """A table shows every target ratio whose two sides it timed; the target's row judges only its `models`,
    from its `min_batch` on (thresholds file): the piecewise tax (PIECEWISE / FULL) on the Llama models at
    batch >= 8, not on ToyLlama, whose table shows it too."""
    text = _regenerate(tmp_path)
    row = _line(text, "| PIECEWISE ≤ 1.1× FULL at batch ≥ 8")
    assert "llama_1b bfloat16 b8: " in row and "llama_8b_4l bfloat16 b512: " in row
    assert " b1: " not in row and " b2: " not in row and "toy_llama" not in row
    assert "| PIECEWISE / meta-pcg | PIECEWISE / FULL | FULL / reduce-overhead |" in _line(
        text, "| batch | eager |"
    )
    assert "toy_llama" not in _line(text, "| PIECEWISE ≤ 0.9× breakable graphs")


def test_an_implementation_not_timed_is_named_with_its_reason_under_its_table(tmp_path):
    """A latency run's entry that was skipped, or failed against eager, is n/a in its table, and the line
    under the table names the implementation and why."""
    _regenerate(tmp_path)
    results = tmp_path / "results"
    details = results / "bench" / MACHINE / "latency_silly_float32.json"
    doc = json.loads(details.read_text())
    doc["entries"].update({"meta-pcg|1": {"skip": "needs the pcg extra"}, "inductor|2": {"error": "boom"}})
    details.write_text(json.dumps(doc))
    line = _line(_report(results).split("### silly, float32")[1], "Not timed (n/a): ")
    assert "meta-pcg: needs the pcg extra" in line and "inductor: error: boom" in line


CPU_BENCHMARKS = ("compile", "host_overhead", "dispatch", "code_size")  # what ci/main.sh runs without CUDA


def _cpu_results(tmp_path: Path, gpu_run_skipped: bool = False) -> Path:
    """A CPU machine's results as `bash ci/main.sh` leaves them (the committed run's CPU benchmarks, details
    of a CPU device); `gpu_run_skipped`: the GPU benchmarks ran too and skipped every value, as `asv run` does
    there."""
    results, machine = tmp_path / "results", "cpu-box"
    (results / "asv" / machine).mkdir(parents=True)
    (results / "bench" / machine).mkdir(parents=True)
    runs = {Path(f): json.loads(Path(f).read_text()) for f in result_files(str(SAMPLE / "asv" / MACHINE))}
    source, doc = max(
        ((f, d) for f, d in runs.items() if "code_size.ReferenceCore.track_lines" in d["results"]),
        key=lambda run: run[1]["results"]["code_size.ReferenceCore.track_lines"][3],
    )
    # the sample predates the model layer's own benchmark: its row, shaped as the core's
    doc["results"]["code_size.ModelLayer.track_lines"] = doc["results"]["code_size.ReferenceCore.track_lines"]
    for name, row in list(doc["results"].items()):
        if name.split(".")[0] not in CPU_BENCHMARKS:
            if not gpu_run_skipped:
                del doc["results"][name]
            elif isinstance(row[0], list):
                row[0] = [None] * len(row[0])
    (results / "asv" / machine / source.name).write_text(json.dumps(doc))
    for name in ("environment", "compile", "code_size", "host_overhead_cpu"):
        details = json.loads((SAMPLE / "bench" / MACHINE / f"{name}.json").read_text())
        details["environment"].update(device="cpu", cuda=None, driver=None, nvml=None)
        (results / "bench" / machine / f"{name}.json").write_text(json.dumps(details))
    return results


def _asv_value(benchmark: str, index: int) -> float:
    """The value at `index` of `benchmark` in the newest committed asv run of MACHINE that has it."""
    runs = [json.loads(Path(f).read_text()) for f in result_files(str(SAMPLE / "asv" / MACHINE))]
    newest = max((d for d in runs if benchmark in d["results"]), key=lambda d: d["date"])
    return newest["results"][benchmark][0][index]


GPU_SECTIONS = ("Latency", "Memory and capture", "Side by side, in rotating rounds")
GPU_TARGETS = (
    "PIECEWISE ≤ 0.9× Meta pcg, every batch",
    "FULL ≤ 1.02× reduce-overhead, every batch",
    "pool for 51 sizes",
    "capture of 51 sizes",
    "host overhead ≤ 2 µs per piece",
    "CompiledModel call ≤ 1.03× its replay run alone",
)


def test_a_cpu_run_says_not_measured_here_for_every_gpu_section(tmp_path):
    text = _report(_cpu_results(tmp_path), "cpu-box")
    for section in GPU_SECTIONS:
        assert f"## {section}\n\nNot measured here (needs CUDA" in text, section
    assert "Median µs per forward" not in text  # no method text over no table
    assert "GPU (pytest-benchmark): not measured here (needs CUDA" in text
    for target in GPU_TARGETS:
        row = _line(text, f"| {target}")
        assert row.endswith("| needs CUDA: this machine has no CUDA device | not measured |  |"), row
    # the committed run's CPU number
    tiny_us = _asv_value("host_overhead.HostOverheadCPU.track_forward_us", 0)
    assert f"| tiny | {tiny_us:.1f} |" in text and "## Dispatch (CPU, per sweep of 600 batch sizes)" in text


def test_gpu_benchmarks_skipped_on_a_cpu_give_the_reason_they_recorded(tmp_path):
    """asv's skip (every value n/a) is never a table or a verdict: the section says not measured here, with
    the reason the benchmark wrote to its details file, and the benchmark's setup raises asv's skip with that
    reason."""
    sys.path.insert(0, str(REPO / "suites"))
    try:
        from benchmarks import latency, memory
    finally:
        sys.path.remove(str(REPO / "suites"))
    results = _cpu_results(tmp_path, gpu_run_skipped=True)
    os.environ.update(
        PIECEWORKS_BENCH_DETAILS=str(results / "bench" / "cpu-box"), PIECEWORKS_COMMIT=SAMPLE_COMMIT
    )
    try:  # as ci/main.sh runs them: the details record the commit
        if not (cache := latency.measure("toy_llama", "bfloat16")).get("skip"):
            pytest.skip("CUDA is available: the GPU benchmarks run here")
        memory_cache = memory.measure()
    finally:
        del os.environ["PIECEWORKS_BENCH_DETAILS"], os.environ["PIECEWORKS_COMMIT"]
    with pytest.raises(NotImplementedError, match="^needs CUDA: torch .* sees no CUDA device here"):
        latency.ToyLlamaBfloat16().setup(cache, "eager", 1)
    with pytest.raises(NotImplementedError, match="^needs CUDA: "):
        memory.CaptureMemory().setup(memory_cache, "FULL", 1)
    text = _report(results, "cpu-box")
    for section, reason in (("Latency", cache["skip"]), ("Memory and capture", memory_cache["skip"])):
        assert f"## {section}\n\nNot measured here ({reason})." in text
    row = _line(text, "| FULL ≤ 1.02× reduce-overhead, every batch")
    assert row.endswith(f"| {cache['skip']} | not measured |  |")
    assert "| n/a |" not in text and "| met |" not in text


def test_every_asv_skip_in_the_suites_carries_a_reason():
    """A benchmark skipped without a message leaves asv's n/a rows with no why: every NotImplementedError
    (asv's skip) raised in suites/benchmarks/ has one."""
    bare = []
    for path in (REPO / "suites" / "benchmarks").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Raise) and node.exc is not None:
                call = node.exc if isinstance(node.exc, ast.Call) else None
                name = ast.unparse(call.func if call else node.exc)
                if name.split(".")[-1] in ("NotImplementedError", "Skip") and not (call and call.args):
                    bare.append(f"{path.name}:{node.lineno}")
    assert not bare


def test_a_benchmark_this_machine_cannot_run_points_to_the_machine_that_ran_it_at_this_commit(tmp_path):
    """A 2-GPU benchmark skipped on a one-GPU machine names the machine that measured it at the same commit
    (the committed H200 runs); never one that measured another commit."""
    one, two, name = "nvidia-h200-single", "nvidia-h200", "latency_llama_8b_4l_tp2_bfloat16"
    for kind, machine in (("asv", one), ("bench", one), ("bench", two)):
        shutil.copytree(REPO / "results" / kind / machine, tmp_path / "results" / kind / machine)
    skip = json.loads((REPO / "results" / "bench" / one / f"{name}.json").read_text())["skip"]
    pointer = f"; measured at this commit on `{two}`: [its report](../{two}/REPORT.md)"
    line = "llama_8b_4l_tp2 bfloat16: not measured here ("
    assert _line(_report(tmp_path / "results", one), line) == f"{line}{skip}{pointer})."

    other = tmp_path / "results" / "bench" / two / f"{name}.json"
    doc = json.loads(other.read_text())
    doc["environment"]["commit"] = "0" * 40
    other.write_text(json.dumps(doc))
    assert _line(_report(tmp_path / "results", one), line) == f"{line}{skip})."


def test_committed_only_where_git_tracks_the_result_files_unmodified(tmp_path):
    results = _cpu_results(tmp_path)
    untracked = _report(results, "cpu-box")
    assert f"from the result files in `{results}`;" in untracked and "from the committed" not in untracked

    _commit(results)
    assert "from the committed result files;" in _report(results, "cpu-box")

    details = results / "bench" / "cpu-box" / "compile.json"
    details.write_text(details.read_text().replace('"layers": 12', '"layers": 13'))
    assert "from the committed" not in _report(results, "cpu-box")
    _git(results, "checkout", "--", ".")
    (results / "bench" / "cpu-box" / "new.json").write_text(
        json.dumps({"environment": {"commit": SAMPLE_COMMIT}})
    )
    assert "from the committed" not in _report(results, "cpu-box")


def test_the_projects_own_checks_stand_apart_from_the_product_targets(tmp_path):
    text = _report(_cpu_results(tmp_path), "cpu-box")
    targets = text[text.index("## Targets") : text.index("\n## ", text.index("## Targets") + 1)]
    own = text[text.index("## The project's own checks") :]
    assert "reference core" not in targets
    for row in (
        _line(own, "| reference core ≤ 1,900 code lines"),
        _line(own, "| model layer ≤ 900 code lines"),
    ):
        assert "| over |" in row or "| within |" in row
        assert "**missed**" not in row and "| met |" not in row


def test_targets_their_limits_and_labels_come_from_the_thresholds_file(tmp_path):
    """A limit or label changed in the thresholds file changes the report's row and verdict: the report keeps
    no copy of its own."""
    table = json.loads((REPO / "ci" / "thresholds.json").read_text())
    table["targets"]["pool_51_vs_largest"].update(limit=0.5, label="pool probe ≤ {limit:g}×")
    table["own_checks"]["core_lines"].update(limit=10**6, label="core probe ≤ {limit:,}")
    (path := tmp_path / "thresholds.json").write_text(json.dumps(table))
    text, _ = report.render(report.load_results(str(SAMPLE), MACHINE, targets=str(path)), MACHINE, "probe")
    assert (
        "| ToyLlama 12 layers PIECEWISE: 1.000×, ToyLlama 12 layers FULL: 1.000×, Llama 1B PIECEWISE: "
        in _line(text, "| pool probe ≤ 0.5× |")
    )
    assert "| **missed** | ToyLlama 12 layers PIECEWISE: pool " in _line(text, "| pool probe ≤ 0.5× |")
    assert "| within |" in _line(text, "| core probe ≤ 1,000,000 |")


@pytest.mark.parametrize("section", sorted(BENCHMARKS))
def test_every_benchmark_the_report_reads_exists_in_suites_benchmarks(section):
    """Each asv class of the report's table is a class of its suites/benchmarks module with the `track_`
    methods the section reads (a section that reads every benchmark of its class: at least one)."""
    missing = []
    for dotted in BENCHMARKS[section].values():
        module, _, name = dotted.partition(".")
        found = getattr(importlib.import_module(f"suites.benchmarks.{module}"), name, None)
        methods = [f"track_{t}" for t in TRACKS[section]] or [
            next((m for m in dir(found) if m.startswith(("time_", "track_"))), "a time_ or track_ method")
        ]
        missing += [f"{dotted}.{m}" for m in methods if not hasattr(found, m)]
    assert not missing, f"the report reads benchmarks suites/benchmarks lacks: {missing}"
