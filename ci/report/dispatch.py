"""The dispatch section (CPU): asv's times of the dispatch sweeps."""

from __future__ import annotations

from .benchmarks import BENCHMARKS
from .parts import Part, fmt, md_table, not_measured
from .results import Results


def dispatch(r: Results) -> Part:
    """asv's µs of each benchmark of the dispatch class, a sweep of 600 batch sizes."""
    rows = sorted(
        (n.split(".")[-1], fmt((us := v.get(())) and us * 1e6))
        for n, v in r.asv.items()
        if n.startswith(BENCHMARKS["dispatch"]["sweeps"] + ".")
    )
    if not rows:
        return not_measured("Dispatch (CPU)", r.skip_reason("dispatch", needs_cuda=False))
    return Part(
        ["## Dispatch (CPU, per sweep of 600 batch sizes)", "", *md_table(["benchmark", "µs"], "lr", rows)]
    )
