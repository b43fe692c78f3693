"""`python -m pieceworks.gate --base BASE --head HEAD [--thresholds FILE] [--markdown FILE]`

BASE and HEAD are asv result sets: a result file, a folder of result files of one commit (rounds of an
interleaved run), or RESULTS_DIR@COMMIT. Prints the table; writes Markdown for a PR comment with --markdown.
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from .report import markdown, summary, text_table
from .results import ResultSetError, load_result_set
from .thresholds import DEFAULT_PATH, ThresholdsError, load_thresholds
from .verdicts import compare, exit_status

USAGE_ERROR = 3


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # exit 2 means "incomplete comparison" here, not a usage error
        self.print_usage(sys.stderr)
        self.exit(USAGE_ERROR, f"{self.prog}: error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    parser = _Parser(
        prog="python -m pieceworks.gate",
        description=__doc__.split("\n\n")[1],
        epilog="exit status: 1 regression (whatever else is incomplete), else 2 incomplete "
        "comparison (missing, failed, skipped, too noisy, no rule), else 0; 3 unusable input",
    )
    parser.add_argument("--base", required=True, help="asv result set of the base (the blessed baseline)")
    parser.add_argument("--head", required=True, help="asv result set of the change under test")
    parser.add_argument("--thresholds", default=DEFAULT_PATH, help="rules file (default: %(default)s)")
    parser.add_argument("--markdown", metavar="FILE", help="also write the report as Markdown (PR comment)")
    parser.add_argument("--base-label", help="how the report names base (default: its path)")
    parser.add_argument("--head-label", help="how the report names head (default: its path)")
    args = parser.parse_args(argv)
    try:
        thresholds = load_thresholds(args.thresholds)
        base = load_result_set(args.base, label=f"base {args.base}")
        head = load_result_set(args.head, label=f"head {args.head}")
    except (ResultSetError, ThresholdsError) as exc:
        print(f"gate: {exc}", file=sys.stderr)
        return USAGE_ERROR
    rows = compare(base, head, thresholds)
    status = exit_status(rows)
    print(
        f"gate: base {base.commit[:8]} ({len(base.files)} file(s), {base.machine}) vs "
        f"head {head.commit[:8]} ({len(head.files)} file(s), {head.machine}); rules {thresholds.path}"
    )
    if base.machine != head.machine:
        print(
            f"gate: WARNING: base ran on {base.machine!r}, head on {head.machine!r}: "
            "timings of different machines are not comparable",
            file=sys.stderr,
        )
    print(text_table(rows))
    print(f"gate: {summary(rows, status)}")
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(markdown(rows, status, args.base_label or args.base, args.head_label or args.head))
    return status


if __name__ == "__main__":
    sys.exit(main())
