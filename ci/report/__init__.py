"""The benchmark report: target verdicts, tables and plots, regenerated from result files; it measures
nothing.

`python -m pieceworks.report --machine NAME` reads asv's results of that machine and `results/bench/NAME/`
(docs/benchmarks.md says which files) and writes `REPORT.md` and `plots/*.png` (matplotlib) there.

Contracts: every ratio comes from numbers of one run; a section without numbers says "not measured here" and
why; one report is one commit's run (the newest, unless `--commit` names another): result files of other
commits are left out; the header says "committed" only where git tracks every result file read unmodified; the
targets, their limits and labels are ci/thresholds.json's "targets" and "own_checks", reported, never
asserted.
"""

from __future__ import annotations

import argparse
import os
import sys

from pieceworks.gate.results import ResultSetError

from .document import render, write_plots
from .results import Results, load_results, result_files_source

__all__ = ["Results", "load_results", "main", "render", "result_files_source"]


def main(argv: list[str] | None = None) -> int:
    """The command (see the module's docstring); returns its exit status."""
    parser = argparse.ArgumentParser(prog="python -m pieceworks.report", description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results", help="the results folder (asv/ and bench/ inside)")
    parser.add_argument("--machine", required=True, help="asv machine name (a folder of results/asv/)")
    parser.add_argument(
        "--commit", default=None, help="the commit whose results to report (default: the newest)"
    )
    parser.add_argument(
        "--no-plots", action="store_true", help="REPORT.md only (its plot links stay as they are)"
    )
    args = parser.parse_args(argv)
    try:
        results = load_results(args.results, args.machine, args.commit)
    except ResultSetError as exc:
        print(f"report: {exc}: run the benchmarks first", file=sys.stderr)
        return 1
    text, body = render(results, args.machine, result_files_source(results.files, args.results))
    os.makedirs(bench := os.path.join(args.results, "bench", args.machine), exist_ok=True)
    plots = [] if args.no_plots else write_plots(body.plots, os.path.join(bench, "plots"))
    with open(os.path.join(bench, "REPORT.md"), "w") as f:
        f.write(text)
    print(f"report: wrote {os.path.join(bench, 'REPORT.md')} and {len(plots)} plots")
    return 0
