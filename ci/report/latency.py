"""The latency section: a table per model and dtype, the kernel profiles, the latency targets."""

from __future__ import annotations

import functools
from typing import Any

from . import notes
from .benchmarks import BENCHMARKS, TRACKS
from .parts import Part, fmt, md_table, not_measured, ratio_row, ratio_text
from .results import Results

LATENCY_TABLES = BENCHMARKS["latency"]  # {(model, dtype): asv class}
LATENCY_TARGETS = (
    "piecewise_vs_pcg",
    "piecewise_vs_breakable",
    "piecewise_vs_full",
    "full_vs_reduce_overhead",
)


def latency(r: Results) -> Part:
    """A table per model and dtype, the kernel profiles, and a row per target ratio judged on its "models"
    (batches from its "min_batch"), misses explained by `profile_note`."""
    # (model and dtype, batch, ratio, per-round spread)
    worst: dict[str, list] = {key: [] for key in LATENCY_TARGETS}
    tables = {(m, d): latency_table(r, m, d, worst) for m, d in LATENCY_TABLES}
    reason = r.skip_reason("latency_toy_llama_bfloat16")
    if not any(t.lines for t in tables.values()):
        part = not_measured("Latency", reason)
    else:
        part = Part(["## Latency", "", "Median µs per forward (IQR); each ratio from its table's run.", ""])
        for (m, d), table in tables.items():
            part.add(
                table if table.lines else not_measured(f"{m} {d}", r.skip_reason(f"latency_{m}_{d}"), False)
            )
    for key, found in worst.items():
        part.add(
            ratio_row(
                r,
                key,
                found,
                reason,
                functools.partial(notes.profile_note, r, impls=r.targets[key]["sides"]),
            )
        )
    return part.add(kernel_profiles(r))


def latency_table(r: Results, model: str, dtype: str, worst: dict[str, list]) -> Part:
    """One latency class's table with the target ratios whose sides it timed, the implementations it could not
    time and why, and its plot (nothing where nothing was measured); adds the ratios its model is judged on to
    `worst`."""
    found, iqr = (r.asv.get(f"{LATENCY_TABLES[model, dtype]}.track_{t}", {}) for t in TRACKS["latency"])
    details = r.details.get(f"latency_{model}_{dtype}", {})
    batches = sorted({k[1] for k in found})
    present = [
        i for i in dict.fromkeys(k[0] for k in found) if any(found.get((i, b)) is not None for b in batches)
    ]
    if not present:
        return Part()
    targets = [k for k in LATENCY_TARGETS if set(r.targets[k]["sides"]) <= set(present)]
    rows = [
        [
            b,
            *(
                "n/a" if found.get((i, b)) is None else f"{found[i, b]:.0f} ({fmt(iqr.get((i, b)), 0)})"
                for i in present
            ),
        ]
        for b in batches
    ]
    for row, b in zip(rows, batches):
        for key, t in ((k, r.targets[k]) for k in targets):
            in_rounds = details.get("ratios", {}).get(str(b), {}).get(t["ratio"])
            ratio, spread = latency_ratio(in_rounds, *(found.get((i, b)) for i in t["sides"]))
            row.append(ratio_text(ratio, spread))
            judged = model in t["models"] and b >= t.get("min_batch", 0)
            worst[key] += [(f"{model} {dtype}", b, ratio, spread)] * judged
    lines = [
        f"### {model}, {dtype}",
        "",
        *md_table(
            ["batch", *present, *(r.targets[k]["ratio"] for k in targets)],
            "r" * (len(present) + len(targets) + 1),
            rows,
        ),
    ]
    if rounds := details.get("side_by_side"):
        lines += [
            f"Timed side by side in {details.get('rounds')} rotating rounds: {', '.join(rounds)}; the others "
            "each alone, before them.",
            "",
        ]
    failed = {
        k.split("|")[0]: e.get("skip") or f"error: {e['error']}"
        for k, e in details.get("entries", {}).items()
        if "skip" in e or "error" in e
    }  # an implementation skipped, or failed against eager, and why
    lines += [f"Not timed (n/a): {'; '.join(f'{i}: {why}' for i, why in failed.items())}.", ""] * bool(failed)
    if pools := details.get("pool_mib_by_rank"):  # tensor parallel: rank 0's times, each rank's graph pool
        lines += [
            "Times of rank 0. Graph pool MiB after the capture: "
            + "; ".join(
                f"rank {n}: " + ", ".join(f"{i} {mib:.0f}" for i, mib in p.items())
                for n, p in enumerate(pools)
            )
            + ".",
            "",
        ]
    return Part(
        lines,
        plots=[
            (
                f"latency_{model}_{dtype}.png",
                f"{model}, {dtype}: latency vs batch",
                {i: (batches, [found.get((i, b)) for b in batches]) for i in present},
            )
        ],
    )


def latency_ratio(
    in_rounds: dict | None, top: float | None, bottom: float | None
) -> tuple[float | None, Any]:
    """(ratio, its per-round spread or None): the median of the per-round ratios where the run timed both
    sides in rotating rounds, else (a run that timed each in turn) one median over the other."""
    if in_rounds:
        return in_rounds["median"], in_rounds
    return (top / bottom if top and bottom else None), None


def kernel_profiles(r: Results) -> Part:
    """The latency runs' kernel profiles: kernel µs per forward and the library kernels' share of them, a row
    per model, dtype and batch, a column per implementation profiled."""
    rows: dict[tuple[str, str, int], dict[str, str]] = {}
    for model, dtype in LATENCY_TABLES:
        for key, p in r.details.get(f"latency_{model}_{dtype}", {}).get("profiles", {}).items():
            if "device_us_per_call" in p:
                impl, batch = key.split("|")
                rows.setdefault((model, dtype, int(batch)), {})[impl] = (
                    f"{p['device_us_per_call']:.0f} ({p['library_share']:.0%})"
                )
    impls = list(dict.fromkeys(i for row in rows.values() for i in row))
    return Part(
        [
            "### Kernel profiles",
            "",
            "Kernel µs per forward (library kernels' share).",
            "",
            *md_table(
                ["model", "dtype", "batch", *impls],
                "llr" + "r" * len(impls),
                (
                    [*k, *(row.get(i, "n/a") for i in impls)]
                    for k, row in sorted(
                        rows.items(), key=lambda kv: (list(LATENCY_TABLES).index(kv[0][:2]), kv[0][2])
                    )
                ),
            ),
        ]
        if rows
        else []
    )
