"""The size of the reference core, tracked per commit like any benchmark.

`track_lines`: all lines of reference/'s Python files, or code lines only (no blank lines, comments or docstrings;
`pieceworks.harness.code_size`). Runs anywhere; the per-file counts go to the details file for the report.
"""

from __future__ import annotations

from . import _shared


class ReferenceCore:
    params = [["lines", "code"]]
    param_names = ["count"]

    def setup_cache(self):
        from pieceworks.harness.code_size import core_lines

        found = core_lines()
        _shared.write_details("code_size", {"files": found})
        return found["total"]

    def track_lines(self, total, count):
        return total[count]

    track_lines.unit = "lines"
