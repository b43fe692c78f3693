"""The conformance table, from a run's JSON (the conformance suite's `--conformance-json PATH`).

`python -m pieceworks.conformance.table PATH [PATH ...] [--out FILE]` writes Markdown: per model,
implementation x property, each cell pass, FAIL, error, n/a or skipped (n/a and skipped with a numbered note
giving the reason); an implementation unavailable here is one line with the reason; each failure with its
message and minimal example. Several paths are the parts of one run split by `--impl` (a process per part,
so that each finishes within a job's limit): one table (`merge`). Deterministic: the same JSON gives the same
bytes.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
from typing import Any

__all__ = ["merge", "render", "main"]

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


# What every part of one run must share: the machine, torch, and what was drawn and served
_SHARED = ("device", "gpu", "torch", "cuda", "seed", "capture_sizes", "batches", "plan")


def merge(documents: list[dict[str, Any]]) -> dict[str, Any]:
    """One document of the parts of a run split by `--impl`: their results and implementations together,
    each part's start and command kept (`runs`). ValueError where the parts differ in what they must share
    (`_SHARED`: another machine, torch, seed or plan is another run) or a cell appears in two of them."""
    first = documents[0]
    for other in documents[1:]:
        for key in _SHARED:
            if first["meta"].get(key) != other["meta"].get(key):
                raise ValueError(
                    f"conformance parts differ in {key}: {first['meta'].get(key)!r} and "
                    f"{other['meta'].get(key)!r}; join the parts of one run only (same machine, torch and "
                    "options, split by --impl)"
                )
    cells = collections.Counter(
        (r["impl"], r["model"], r["property"]) for d in documents for r in d["results"]
    )
    if twice := [cell for cell, n in cells.items() if n > 1]:
        raise ValueError(
            f"conformance parts overlap: {' / '.join(twice[0])} is in two of them; split by --impl"
        )
    meta = {**first["meta"]}
    for key in ("properties", "implementations", "models"):
        if isinstance(meta.get(key), dict):
            meta[key] = {k: v for d in documents for k, v in d["meta"].get(key, {}).items()}
    return {
        **first,
        "meta": meta,
        "results": [r for d in documents for r in d["results"]],
        "runs": [r for d in documents for r in d.get("runs") or [{k: d.get(k) for k in ("created", "argv")}]],
    }


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
        "; ".join(
            f"Run {run.get('created', '?')}: `{' '.join(run.get('argv') or [])}`"
            for run in document.get("runs") or [document]
        )
        + "; "
        + (
            meta.get("plan")
            or f"capture sizes {meta.get('capture_sizes')}, batches served {meta.get('batches')}"
        )
        + ". Regenerate: `python -m pieceworks.conformance.table <json> [<json> ...] --out <this file>`.",
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
    parser.add_argument("json", nargs="+", help="the run's JSON (--conformance-json), or its parts' JSONs")
    parser.add_argument("--out", default=None, help="write the Markdown here (default: stdout)")
    args = parser.parse_args(argv)
    documents = []
    for path in args.json:
        with open(path) as f:
            documents.append(json.load(f))
    try:
        text = render(merge(documents))
    except ValueError as error:
        parser.error(str(error))
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
