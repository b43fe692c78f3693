"""The benchmark report (`python -m pieceworks.harness.report`): made from committed result files only.

- The committed H100 report is exactly what the committed results regenerate (no number edited by hand, and a
  change to the report code shows up as a change to the committed report).
- A missed ratio is explained by both of its sides: their kernel time, GPU busy share and the kernels only the
  slower side runs, from the latency run's own profiles; where that run profiled one side only (older runs), from a
  side-by-side profile (`python -m pieceworks.harness.profile --out results/bench/<machine>/profile_*.json`); with
  neither, from what the latency run profiled.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from pieceworks.harness import report

REPO = Path(__file__).resolve().parent.parent
MACHINE = "nvidia-h100-80gb-hbm3"


def _regenerate(tmp_path: Path, drop: tuple[str, ...] = (), one_side: bool = False) -> str:
    """The report of a copy of the committed results, without the files matching `drop`; `one_side`: the latency
    runs' profiles of reduce-overhead removed (as older runs profiled eager, pcg and PIECEWISE only)."""
    results = tmp_path / "results"
    shutil.copytree(REPO / "results" / "asv", results / "asv")
    shutil.copytree(REPO / "results" / "bench" / MACHINE, results / "bench" / MACHINE,
                    ignore=shutil.ignore_patterns("plots", "REPORT.md", *drop))
    for path in (results / "bench" / MACHINE).glob("latency_toy_llama_*.json") if one_side else ():
        doc = json.loads(path.read_text())
        doc["profiles"] = {k: v for k, v in doc["profiles"].items() if not k.startswith("reduce-overhead|")}
        path.write_text(json.dumps(doc))
    assert report.main(["--results", str(results), "--machine", MACHINE]) == 0
    return (results / "bench" / MACHINE / "REPORT.md").read_text()


def test_the_committed_report_is_what_the_committed_results_regenerate(tmp_path):
    committed = (REPO / "results" / "bench" / MACHINE / "REPORT.md").read_text()
    assert _regenerate(tmp_path) == committed, (
        "results/bench/<machine>/REPORT.md differs from what its result files give: regenerate it with "
        "`python -m pieceworks.harness.report --machine <machine>` and commit it")


def _full_target(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("| FULL ≤ 1.02× reduce-overhead"))


def test_a_miss_is_explained_by_both_sides_and_the_kernels_only_one_runs(tmp_path):
    row = _full_target(_regenerate(tmp_path, drop=("profile_*.json",)))
    assert "**missed**" in row
    assert ": pieceworks-full " in row and " vs reduce-overhead " in row and "side-by-side" not in row
    assert row.count("% busy") >= 2 and "kernels only in pieceworks-full: `" in row


def test_a_side_by_side_profile_explains_a_miss_the_latency_run_profiled_one_side_of(tmp_path):
    row = _full_target(_regenerate(tmp_path, one_side=True))
    assert "**missed**" in row
    assert "(side-by-side profile): pieceworks-full" in row and " vs reduce-overhead " in row
    assert row.count("% busy") >= 2 and row.count("kernels") >= 2

    without = _full_target(_regenerate(tmp_path / "without", drop=("profile_*.json",), one_side=True))
    assert "side-by-side" not in without and " vs reduce-overhead " not in without and "**missed**" in without


def test_a_warm_start_miss_says_where_the_first_call_went(tmp_path):
    """With the compile benchmark's breakdown recorded (backend seconds, of which compile or load), the compile table
    shows it and a missed warm-start target is split into Dynamo's side and the backend's; without it, n/a."""
    results = tmp_path / "results"
    _regenerate(tmp_path)
    details = results / "bench" / MACHINE / "compile.json"
    doc = json.loads(details.read_text())
    first_call = {}
    for start, entry in doc["entries"].items():
        entry.update(backend_seconds=0.25 * entry["first_call_seconds"], compile_or_load_seconds=0.2 * entry["first_call_seconds"])
        first_call[start] = entry["first_call_seconds"]
    details.write_text(json.dumps(doc))
    assert report.main(["--results", str(results), "--machine", MACHINE]) == 0
    text = (results / "bench" / MACHINE / "REPORT.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| warm start:"))
    warm = first_call["warm"]
    assert "**missed**" in row
    assert f"warm: {warm:.2f} s = {0.75 * warm:.2f} s outside the backend" in row
    assert f"+ {0.25 * warm:.2f} s in it, {0.2 * warm:.2f} s of which loading the pieces" in row
    table = next(line for line in text.splitlines() if line.startswith("| warm |"))
    assert f"| {0.25 * warm:.2f} | {0.2 * warm:.2f} | {0.75 * warm:.2f} |" in table
