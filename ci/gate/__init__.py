"""The benchmark gate (`python -m pieceworks.gate`): two asv result sets judged by per-metric thresholds.

Installs as `pieceworks.gate` from ci/gate/; standard library only; the reference core never imports it. Exit
status: 1 a regression (whatever else is incomplete), else 2 an incomplete comparison (a benchmark base
measured is missing, failed or skipped in head, too noisy, or without a rule), else 0; 3 unusable input.
Beside it, `python -m pieceworks.gate.preflight` (preflight.py) refuses a GPU that would skew the benchmarks.
"""

from .results import ResultSet, ResultSetError, load_result_set
from .thresholds import Thresholds, ThresholdsError, load_thresholds
from .verdicts import Row, compare, exit_status

__all__ = [
    "Row",
    "compare",
    "exit_status",
    "ResultSet",
    "ResultSetError",
    "load_result_set",
    "Thresholds",
    "ThresholdsError",
    "load_thresholds",
    "main",
]


def main(argv: list[str] | None = None) -> int:
    from .__main__ import main as _main

    return _main(argv)
