"""The benchmark report (`python -m pieceworks.harness.report`): made from committed result files only.

- The committed H100 report is exactly what the committed results regenerate (no number edited by hand, and a
  change to the report code shows up as a change to the committed report).
- A target missed where the latency run profiled only one side of the ratio is explained from a side-by-side
  profile (`python -m pieceworks.harness.profile --out results/bench/<machine>/profile_*.json`): both sides, their
  kernel time and GPU busy share; without that file the note falls back to what the latency run profiled.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pieceworks.harness import report

REPO = Path(__file__).resolve().parent.parent
MACHINE = "nvidia-h100-80gb-hbm3"


def _regenerate(tmp_path: Path, drop: tuple[str, ...] = ()) -> str:
    results = tmp_path / "results"
    shutil.copytree(REPO / "results" / "asv", results / "asv")
    shutil.copytree(REPO / "results" / "bench" / MACHINE, results / "bench" / MACHINE,
                    ignore=shutil.ignore_patterns("plots", "REPORT.md", *drop))
    assert report.main(["--results", str(results), "--machine", MACHINE]) == 0
    return (results / "bench" / MACHINE / "REPORT.md").read_text()


def test_the_committed_report_is_what_the_committed_results_regenerate(tmp_path):
    committed = (REPO / "results" / "bench" / MACHINE / "REPORT.md").read_text()
    assert _regenerate(tmp_path) == committed, (
        "results/bench/<machine>/REPORT.md differs from what its result files give: regenerate it with "
        "`python -m pieceworks.harness.report --machine <machine>` and commit it")


def _full_target(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("| FULL ≤ 1.02× reduce-overhead"))


def test_a_miss_is_explained_by_both_sides_of_a_side_by_side_profile(tmp_path):
    row = _full_target(_regenerate(tmp_path))
    assert "**missed**" in row
    assert "(side-by-side profile): pieceworks-full" in row and " vs reduce-overhead " in row
    assert row.count("% busy") >= 2 and row.count("kernels") >= 2

    without = _full_target(_regenerate(tmp_path / "without", drop=("profile_*.json",)))
    assert "side-by-side" not in without and "**missed**" in without
