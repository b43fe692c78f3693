"""The conformance table, from a run's JSON (the conformance suite's `--conformance-json PATH`).

`python -m pieceworks.conformance.table PATH [--out FILE]` writes Markdown: per model, implementation x
property, each cell pass, FAIL, error, n/a or skipped (n/a and skipped with a numbered note giving the
reason); an implementation unavailable here is one line with the reason; each failure with its message and
minimal example. Deterministic: the same JSON gives the same bytes.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from typing import Any

__all__ = ["render", "main"]

_CELL = {
    "pass": "pass",
    "fail": "**FAIL**",
    "error": "**error**",
    "n/a": "n/a",
    "skipped": "skipped",
    "unavailable": "unavailable",
}


def _ordered(values: list[str]) -> list[str]:
    return list(dict.fromkeys(values))


def render(document: dict[str, Any]) -> str:
    """The Markdown table of one run's JSON document."""
    meta = document.get("meta", {})
    results = document["results"]
    properties = _ordered(list(meta.get("properties", {})) + [r["property"] for r in results])
    models = _ordered([r["model"] for r in results])
    impls = _ordered([r["impl"] for r in results])
    cells = {(r["impl"], r["model"], r["property"]): r for r in results}
    notes: dict[str, int] = {}

    def note(reason: str) -> str:
        return f"[{notes.setdefault(reason, len(notes) + 1)}]"

    device = meta.get("gpu") or meta.get("device", "?")
    counts = collections.Counter(r["outcome"] for r in results)
    lines = [
        f"# Conformance: {device}, torch {meta.get('torch', '?')}",
        "",
        f"Run {document.get('created', '?')}: `{' '.join(document.get('argv', []))}`; "
        + (
            meta.get("plan")
            or f"capture sizes {meta.get('capture_sizes')}, batches served {meta.get('batches')}"
        )
        + ". Regenerate: `python -m pieceworks.conformance.table <json> --out <this file>`.",
        "",
        "Cells: pass; **FAIL** (listed below with its example); n/a [k]: the property needs what the "
        "implementation does not claim or expose, note k says why (a contract, not a bug); skipped [k]: not "
        "run here, note k says why.",
        "",
        "Totals: " + ", ".join(f"{n} {k}" for k, n in sorted(counts.items())),
        "",
    ]
    for model in models:
        lines += [
            f"## {model}",
            "",
            "| implementation | " + " | ".join(properties) + " |",
            "|---|" + "---|" * len(properties),
        ]
        for impl in impls:
            row = [cells.get((impl, model, p)) for p in properties]
            present = [r for r in row if r is not None]
            if not present:
                continue
            if (
                all(r["outcome"] == "unavailable" for r in present)
                and len({r["reason"] for r in present}) == 1
            ):
                lines.append(
                    f"| {impl} | unavailable {note(present[0]['reason'])} |" + " |" * (len(properties) - 1)
                )
                continue
            shown = [
                ""
                if r is None
                else f"{_CELL[r['outcome']]} {note(r['reason'])}"
                if r["outcome"] in ("n/a", "skipped", "unavailable") and r.get("reason")
                else _CELL.get(r["outcome"], r["outcome"])
                for r in row
            ]
            lines.append(f"| {impl} | " + " | ".join(shown) + " |")
        lines.append("")
    if notes:
        lines += ["## Notes", "", *(f"{k}. {reason}" for reason, k in notes.items()), ""]
    failures = [r for r in results if r["outcome"] in ("fail", "error")]
    lines += ["## Failures", "", *([] if failures else ["None.", ""])]
    for r in failures:
        lines += [
            f"### {r['impl']} / {r['model']} / {r['property']} ({r['outcome']})",
            "",
            f"{r.get('reason') or ''}",
            "",
            f"`{r.get('nodeid', '')}`",
            "",
        ]
        if r.get("example"):
            lines += ["```", r["example"], "```", ""]
    implementations = meta.get("implementations", {})
    if implementations:
        lines += ["## Implementations", "", "| implementation | adapter | claims |", "|---|---|---|"]
        for name, info in implementations.items():
            claims = ", ".join(k for k, v in info.get("capabilities", {}).items() if v) or "-"
            lines.append(f"| {name} | `{info.get('spec', name)}` | {claims} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", help="the run's JSON (--conformance-json)")
    parser.add_argument("--out", default=None, help="write the Markdown here (default: stdout)")
    args = parser.parse_args(argv)
    with open(args.json) as f:
        text = render(json.load(f))
    if args.out is None:
        sys.stdout.write(text)
        return 0
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
