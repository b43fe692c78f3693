"""The gate's table, as plain text for the log and as Markdown for a pull-request comment.

Rows are ordered worst first: incomplete (missing, failed, ...), regressions, improvements, then the rest.
Values are shown in the benchmark's unit, scaled (seconds as ns/µs/ms/s, bytes as KiB/MiB/GiB).
"""

from __future__ import annotations

import math

from .verdicts import CONTROL, IMPROVED, INCOMPLETE, INFO, NEW, OK, REGRESSION, Row

__all__ = ["format_value", "text_table", "markdown"]

HEADER = ("benchmark", "parameter", "base", "head", "ratio", "threshold", "verdict")
_TIME = {"seconds": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}


def format_value(value: float | str | None, unit: str | None) -> str:
    if value is None:
        return "absent"
    if isinstance(value, str):
        return value
    if math.isinf(value) or math.isnan(value):
        return str(value)
    if unit in _TIME:
        seconds = value * _TIME[unit]
        for scale, name in ((1.0, "s"), (1e-3, "ms"), (1e-6, "µs")):
            if abs(seconds) >= scale:
                return f"{seconds / scale:.4g} {name}"
        return f"{seconds / 1e-9:.4g} ns"
    if unit == "bytes":
        for scale, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if abs(value) >= scale:
                return f"{value / scale:.4g} {name}"
        return f"{value:.0f} B"
    return f"{value:.4g}" + (f" {unit}" if unit and unit != "unitless" else "")


def _rank(row: Row) -> int:
    """0 incomplete, 1 regression, 2 improved, 3 the rest: the order rows are shown in."""
    return (
        0
        if row.verdict in INCOMPLETE
        else 1
        if row.verdict in REGRESSION
        else 2
        if row.verdict == IMPROVED
        else 3
    )


def _cells(row: Row) -> tuple[str, ...]:
    ratio = "" if row.ratio is None else f"{row.ratio:.3f}"
    threshold = "" if row.threshold is None else f"+{row.threshold:.0%}"
    verdict = row.verdict + (f" ({row.note})" if row.note else "")
    return (
        row.benchmark,
        row.params,
        format_value(row.base, row.unit),
        format_value(row.head, row.unit),
        ratio,
        threshold,
        verdict,
    )


def summary(rows: list[Row], status: int) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.verdict] = counts.get(r.verdict, 0) + 1
    word = {0: "PASS", 1: "FAIL: regression", 2: "FAIL: incomplete comparison"}[status]
    return f"{word} ({', '.join(f'{n} {v}' for v, n in sorted(counts.items()))})"


def text_table(rows: list[Row]) -> str:
    table = [HEADER] + [_cells(r) for r in sorted(rows, key=_rank)]
    widths = [max(len(line[i]) for line in table) for i in range(len(HEADER))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _md_table(rows: list[Row]) -> list[str]:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * 2 + "---:|" * 4 + "---|"]
    for r in rows:
        cells = [c.replace("|", "\\|") for c in _cells(r)]
        cells[0] = f"`{cells[0]}`"
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(rows: list[Row], status: int, base_label: str, head_label: str) -> str:
    """A PR comment: the verdict line, the rows that need attention, the rest folded away."""
    ordered = sorted(rows, key=_rank)
    attention = [r for r in ordered if _rank(r) < 3]
    rest = [r for r in ordered if _rank(r) == 3 and r.verdict in (OK, INFO, NEW, CONTROL)]
    out = [
        f"### Benchmark gate: {summary(rows, status)}",
        "",
        f"base `{base_label}` → head `{head_label}`; ratio = head / base (lower is better); "
        "threshold = allowed increase, widened where the measured spread is larger.",
        "",
    ]
    out += _md_table(attention) if attention else ["Nothing regressed, improved, failed or went missing."]
    if rest:
        out += [
            "",
            f"<details><summary>{len(rest)} unchanged (within threshold), new, informational or controls"
            f"</summary>",
            "",
        ]
        out += _md_table(rest)
        out += ["", "</details>"]
    return "\n".join(out) + "\n"
