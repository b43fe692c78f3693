"""The side-by-side section: the newest runtime breakdown's tables and its call-over-plan target."""

from __future__ import annotations

from . import notes
from .parts import Part, fmt, md_table, not_measured, ratio_row, ratio_text
from .results import Results


def side_by_side(r: Results) -> Part:
    """The newest runtime breakdown (`python -m pieceworks.harness.measure.side_by_side`): a table per dtype
    of each variant's median µs and each ratio it timed (the median of its per-round ratios, with their
    range), and the call-over-plan target row, a miss explained by `notes.call_profile_note`; its PIECEWISE /
    pcg and FULL ratios are table cells only."""
    doc, title, key = r.details.get("runtime_breakdown"), "Side by side, in rotating rounds", "call_vs_replay"
    if not doc:
        return not_measured(title, r.skip_reason("runtime_breakdown"))
    results, found = doc.get("dtypes") or {}, []
    part = Part(
        [
            f"## {title}",
            "",
            f"`python -m pieceworks.harness.measure.side_by_side`, commit {doc['commit']}, "
            f"{doc.get('date', '?')} ({doc.get('device', '?')}, torch {doc.get('torch', '?')}): median µs.",
            "",
        ]
    )
    for dtype, result in results.items():
        if not (rows := result.get("batches")):
            part.add(not_measured(dtype, str(result.get("crashed") or result.get("errors")), False))
            continue
        shown = list(dict.fromkeys(v for row in rows.values() for v in row["us"]))
        ratios = list(
            dict.fromkeys(n for row in rows.values() for n, x in row.get("ratios", {}).items() if x)
        )
        cells = (
            [
                b,
                *(fmt(row["us"].get(v, {}).get("median_us")) for v in shown),
                *(
                    ratio_text((row["ratios"].get(n) or {}).get("median"), row["ratios"].get(n), 3)
                    for n in ratios
                ),
            ]
            for b, row in rows.items()
        )
        part.lines += [
            f"### {dtype}",
            "",
            *md_table(["batch", *shown, *ratios], "r" * (1 + len(shown) + len(ratios)), cells),
        ]
        found += [
            (dtype, b, x["median"], x)
            for b, row in rows.items()
            if (x := row.get("ratios", {}).get(r.targets[key]["ratio"]))
        ]
    return part.add(
        ratio_row(r, key, found, "", lambda d, _: notes.call_profile_note(d, results[d]), "rounds_label")
        if found
        else Part()
    )
