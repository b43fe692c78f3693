"""The memory and capture section: a table per model, the pool, estimate and capture targets."""

from __future__ import annotations

from . import notes
from .benchmarks import BENCHMARKS, TRACKS
from .parts import Part, fmt, md_table, not_measured, target_row
from .results import Results

# {asv track: column}: the columns of a memory table, in TRACKS' order
MEMORY_COLUMNS = dict(
    zip(
        TRACKS["memory"],
        (
            "pool",
            "estimate",
            "reserved Δ",
            "NVML used Δ",
            "unshared pool",
            "unshared reserved Δ",
            "unshared NVML Δ",
            "capture s",
        ),
    )
)
MODES = ("PIECEWISE", "FULL", "FULL_AND_PIECEWISE")  # pieceworks' modes (memory.MODES)
PEERS = ("meta-pcg", "breakable")  # the compiler-free peers (memory.PEERS)
MEMORY_SUBJECTS = (*MODES, *PEERS)


def memory(r: Results) -> Part:
    """A memory table per model of `BENCHMARKS["memory"]` (1, 8 and 51 sizes; pieceworks' modes, then the
    peers), and the pool, estimate and capture targets judged on their "models", a capture miss explained
    by `notes.capture_note`."""
    found: dict[str, list[tuple[str, bool, str]]]  # per target: (text, met, note) of each mode
    part, found = (
        Part(),
        {
            k: []
            for k in (
                "pool_51_vs_largest",
                "pool_estimate_error",
                "capture_51_s",
                "capture_51_vs_peer",
                "capture_ms_per_size",
            )
        },
    )
    for (model, title), benchmark in BENCHMARKS["memory"].items():
        runs = {
            m: {n: {k: r.value(f"{benchmark}.track_{k}", m, n) for k in MEMORY_COLUMNS} for n in (1, 8, 51)}
            for m in MEMORY_SUBJECTS
        }
        if all(runs[m][1]["pool_mib"] is None for m in ("PIECEWISE", "FULL")):
            continue
        part.lines += [
            f"### {title}, bfloat16",
            "",
            *md_table(
                ["mode", "sizes", *MEMORY_COLUMNS.values()],
                "lrrrrrrrrr",
                (
                    [m, n, *(fmt(x, 2 if k == "capture_seconds" else 1) for k, x in v.items())]
                    for m, by_n in runs.items()
                    for n, v in by_n.items()
                    if v["pool_mib"] is not None
                ),
            ),
        ]
        peers = {m: runs[m][51]["capture_seconds"] for m in PEERS if runs[m][51]["capture_seconds"]}
        for mode, s in ((m, runs[m]) for m in MODES):
            pool, seconds = (
                s[1]["pool_mib"] and s[51]["pool_mib"] and s[51]["pool_mib"] / s[1]["pool_mib"],
                s[51]["capture_seconds"],
            )
            error = (
                s[51]["pool_mib"]
                and s[51]["estimate_mib"] is not None
                and abs(s[51]["estimate_mib"] - s[51]["pool_mib"]) / s[51]["pool_mib"]
            )
            fastest = min(peers, key=peers.__getitem__) if peers else None
            vs_peer = seconds / peers[fastest] if seconds and fastest else None
            for key, x, text in [
                ("pool_51_vs_largest", pool, f"{fmt(pool, 3)}×"),
                (
                    "pool_estimate_error",
                    error if error is not False else None,
                    (f"{fmt(s[51]['estimate_mib'], 1)} vs {fmt(s[51]['pool_mib'], 1)} MiB"),
                ),
                ("capture_51_s", seconds, f"{fmt(seconds, 2)} s"),
                ("capture_51_vs_peer", vs_peer, f"{fmt(vs_peer, 2)}× {fastest}"),
                ("capture_ms_per_size", seconds and 1e3 * seconds / 51, ""),
            ]:
                if model in r.targets[key]["models"] and x is not None:
                    note = (
                        ""
                        if x <= r.limit(key) or key == "pool_estimate_error"
                        else notes.pool_note(f"{title} {mode}", s)
                        if key == "pool_51_vs_largest"
                        else notes.capture_note(r, model, mode)
                    )
                    found[key].append((f"{title} {mode}: {text or f'{x:.1f} ms'}", x <= r.limit(key), note))
    if not part.lines:
        return not_measured(
            "Memory and capture", r.skip_reason("memory"), targets=[r.label(key) for key in found]
        )
    part.lines[:0] = ["## Memory and capture", "", "MiB; unshared: a pool per size.", ""]
    for key, rows in found.items():
        part.add(target_row(r.label(key), [row[:2] for row in rows], "", "; ".join(n for *_, n in rows if n)))
    return part
