"""What a section adds (`Part`) and the pieces sections are written in: numbers and ratios as text, Markdown
tables, "not measured here" and target rows."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from .results import Results


@dataclasses.dataclass
class Part:
    """What a section adds: Markdown lines, target and own-check rows (what, measured, verdict, note), and
    latency plots (file name, title, {implementation: (batch sizes, µs or None)})."""

    lines: list[str] = dataclasses.field(default_factory=list)
    targets: list[tuple[str, str, str, str]] = dataclasses.field(default_factory=list)
    own_checks: list[tuple[str, str, str, str]] = dataclasses.field(default_factory=list)
    plots: list[tuple[str, str, dict]] = dataclasses.field(default_factory=list)

    def add(self, other: Part) -> Part:
        for field in dataclasses.fields(self):
            getattr(self, field.name).extend(getattr(other, field.name))
        return self


def fmt(value: Any, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def ratio_text(ratio: float | None, spread: dict | None, digits: int = 2) -> str:
    """ "1.12× (1.05-1.20)": a ratio with its per-round range where it has one."""
    return f"{fmt(ratio, digits)}×" + (
        f" ({spread['min']:.{digits}f}-{spread['max']:.{digits}f})" if spread else ""
    )


def md_table(columns: list[str], align: str, rows: Iterable[Iterable[Any]]) -> list[str]:
    """A Markdown table, column i aligned left or right as `align`[i] is "l" or "r", and a blank line."""

    def row(cells: Iterable[Any]) -> str:
        return "| " + " | ".join(map(str, cells)) + " |"

    return [row(columns), "|" + "".join("---:|" if a == "r" else "---|" for a in align), *map(row, rows), ""]


def own_time(found: list[dict], key: str, unit: str, calls: str = "calls") -> str:
    """ "`function` 1.2 µs in 3 calls, ..." for the first five functions of a cProfile summary."""
    return ", ".join(
        f"`{p['function']}` {p[key]:.{1 if unit == 'µs' else 2}f} {unit} in {p[calls]:g} calls"
        for p in found[:5]
    )


def not_measured(what: str, reason: str, heading: bool = True, targets: Iterable[str] = ()) -> Part:
    """`what` has no numbers here, and neither have the `targets` (labels) it judges: a section of its own
    (`heading`: "## what", "Not measured here (reason).") or a line of a section that has others ("what: not
    measured here (reason)."); never a method text over no table."""
    line = f"Not measured here ({reason})." if heading else f"{what}: not measured here ({reason})."
    return Part(
        [f"## {what}", ""] * heading + [line, ""], targets=[(t, reason, "not measured", "") for t in targets]
    )


def target_row(
    label: str,
    measured: list[tuple[str, bool]],
    reason: str,
    note: str = "",
    sep: str = ", ",
    none_judged: str = "not measured",
) -> Part:
    """A target's row: each measured value's text, met where every one is within the target; `none_judged`
    (default "not measured") and `reason` where nothing was judged."""
    if not measured:
        return Part(targets=[(label, reason, none_judged, "")])
    met = all(ok for _, ok in measured)
    return Part(
        targets=[(label, sep.join(text for text, _ in measured), "met" if met else "**missed**", note)]
    )


def ratio_row(
    r: Results,
    key: str,
    found: list[tuple],
    reason: str,
    explain: Callable[[str, Any], str],
    field: str = "label",
) -> Part:
    """The row of target ratio `key` (its `field` label) from (dtype, batch, ratio or None, per-round spread
    or None) of one run; the note explains the three worst misses by `explain(dtype, batch)`, each text
    once."""
    found = [(d, b, x, s) for d, b, x, s in found if x is not None]
    worst = sorted((f for f in found if f[2] > r.limit(key)), key=lambda f: -f[2])[:3]
    note = "; ".join(dict.fromkeys(filter(None, (explain(d, b) for d, b, _, _ in worst))))
    return target_row(
        r.label(key, field),
        [(f"{d} b{b}: {ratio_text(x, s)}", x <= r.limit(key)) for d, b, x, s in found],
        reason,
        note,
    )
