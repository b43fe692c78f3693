"""The host-overhead section: pytest-benchmark's table (GPU rows judged) and asv's CPU table."""

from __future__ import annotations

from .benchmarks import BENCHMARKS, TRACKS
from .parts import Part, fmt, md_table, not_measured, target_row
from .results import Results

HOST_COLUMNS = {
    "device": "device",
    "mode": "mode",
    "batch": "batch",
    "pieces": "pieces",
    "forward µs": "forward_us",
    "compiled pieces alone (graph replays)": "compiled_pieces_alone_us",
    "splitting ops alone": "splitting_ops_alone_us",
    "overhead µs": "overhead_us",
    "per piece µs (range over rounds)": "overhead_per_piece_us",
    "replay µs": "replay_run_us",
    "forward / replay": "call_over_replay",
    "wall µs": "wall_us",
}  # {column: pytest-benchmark's field}
# A forward's overhead is its time less its parts' timed alone; below zero, the parts alone took longer than
# within the forward, and the subtraction resolves no overhead at that batch: shown, not judged.
NEGATIVE = "the pieces timed alone took longer than the forward, so the subtraction resolves no overhead"


def resolved(overhead_us: float) -> bool:
    """Whether a forward's overhead (per piece, µs) is one the subtraction resolved: not below zero."""
    return overhead_us >= 0


def host_overhead(r: Results) -> Part:
    """pytest-benchmark's table, its GPU rows judged (overhead per piece, the call over its replay); asv's CPU
    table."""
    bench, reason = r.pytest_benchmark, r.skip_reason("host_overhead")
    rows = sorted(
        (
            {"batch": 4, **b["extra_info"], "wall_us": b["stats"]["median"] * 1e6}
            for b in bench.get("benchmarks", [])
            if "mode" in b.get("extra_info", {})
        ),
        key=lambda x: (str(x["device"]), x["mode"], x["batch"]),
    )
    part = Part(["## Host overhead of the runtime", ""])
    if rows:
        commit, digits = bench.get("commit"), {"overhead_per_piece_us": 2, "call_over_replay": 3}
        part.lines += [
            f"pytest-benchmark (`suites/test_host_overhead.py`), {bench.get('datetime', '?')[:19]} UTC"
            f"{', commit ' + commit[:12] if commit else ''}.",
            "",
            *md_table(
                list(HOST_COLUMNS),
                "llrrrrrrrrrr",
                ([_cell(x, k, digits.get(k, 1)) for k in HOST_COLUMNS.values()] for x in rows),
            ),
        ]
    else:
        part.add(not_measured("GPU (pytest-benchmark)", reason, heading=False))
    gpu, per_piece, call = (
        [x for x in rows if x["device"] != "cpu"],
        "overhead_per_piece_us",
        "call_vs_replay",
    )
    piecewise = sorted((x for x in gpu if x["mode"] == "PIECEWISE"), key=lambda x: x["batch"])
    unresolved = [f"b{x['batch']} {x[per_piece]:.2f} µs" for x in piecewise if not resolved(x[per_piece])]
    why = f"{NEGATIVE} ({', '.join(unresolved)} a piece)" if unresolved else ""
    part.add(
        target_row(
            r.label(per_piece),
            [
                (f"b{x['batch']}: {x[per_piece]:.2f} µs", x[per_piece] <= r.limit(per_piece))
                for x in piecewise
                if resolved(x[per_piece])
            ],
            why or reason,
            note=why and f"not judged: {why}",
            none_judged="unresolved" if why else "not measured",
        )
    )
    part.add(
        target_row(
            r.label(call),
            [
                (
                    f"{x['mode']} b{x['batch']}: {x['call_over_replay']:.3f}×",
                    x["call_over_replay"] <= r.limit(call),
                )
                for x in gpu
                if x.get("call_over_replay") is not None
            ],
            reason,
        )
    )
    name = BENCHMARKS["host_overhead"]["cpu"]  # forward, overhead per forward, per piece, its range
    cpu = {
        m: [r.value(f"{name}.track_{k}", m) for k in TRACKS["host_overhead"]] for m in ("tiny", "toy_llama")
    }
    if not any(v[0] is not None for v in cpu.values()):
        return part.add(
            not_measured("asv, CPU", r.skip_reason("host_overhead_cpu", needs_cuda=False), heading=False)
        )
    return part.add(
        Part(
            [
                "asv, CPU (mode NONE, host clock), µs:",
                "",
                *md_table(
                    ["model", "forward", "overhead per forward", "per piece (range over rounds)"],
                    "lrrr",
                    ([m, fmt(f), fmt(o), with_range(p, lo, hi)] for m, (f, o, p, lo, hi) in cpu.items()),
                ),
            ]
        )
    )


def with_range(value: float | None, low: float | None, high: float | None) -> str:
    """`value` to 2 digits, with its range over rounds where the run recorded one (runs before it did not)."""
    return fmt(value, 2) + (f" ({low:.2f}-{high:.2f})" if low is not None and high is not None else "")


def _cell(row: dict, field: str, digits: int) -> str:
    """A cell of the pytest-benchmark table: the overhead per piece with its range over rounds."""
    if field == "overhead_per_piece_us":
        return with_range(row.get(field), *row.get("overhead_per_piece_range_us", (None, None)))
    return fmt(row.get(field), digits)
