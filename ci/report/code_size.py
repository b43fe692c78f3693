"""The project's own check of the two layers' sizes, the core and the model layer (within or over their
budgets, never met or missed)."""

from __future__ import annotations

from .benchmarks import BENCHMARKS, TRACKS
from .parts import Part
from .results import Results


def code_size(r: Results) -> Part:
    """Each layer's lines and code lines, from asv's run, against its budget."""
    checks = []
    for layer, files_key in (("core", "files"), ("model", "model_files")):
        name = f"{BENCHMARKS['code_size'][layer]}.track_{TRACKS['code_size'][0]}"
        lines, code, label = r.value(name, "lines"), r.value(name, "code"), r.label(f"{layer}_lines")
        if code is None:
            checks.append((label, r.skip_reason("code_size", needs_cuda=False), "not measured", ""))
            continue
        files = sum(k != "total" for k in r.details.get("code_size", {}).get(files_key, {})) or "?"
        verdict = "within" if code <= r.limit(f"{layer}_lines") else "over"
        checks.append((label, f"{code:,.0f} code lines, {lines:,.0f} in all, {files} files", verdict, ""))
    return Part(own_checks=checks)
