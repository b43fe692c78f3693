"""The start-up sections: cold, warm and warm on a new host, a table per model; the warm-start target."""

from __future__ import annotations

from . import notes
from .benchmarks import BENCHMARKS, TRACKS
from .parts import Part, fmt, md_table, not_measured, target_row
from .results import Results

START_NAMES = ("cold", "warm", "warm_new_host")
START_COLUMNS = {
    "first call s": "first_call_seconds",
    "vs cold": None,
    "trace s": "trace_seconds",  # {column: field}
    "split s": "split_seconds",
    "load s": "load_seconds",
    "compile s": "compile_seconds",
    "capture s": "capture_seconds",
    "process s": "process_seconds",
    "Inductor compiles": "inductor_compiles",
    "kernel rebuilds": "kernel_rebuilds",
    "traces": "dynamo_traces",
    "artifacts loaded": "artifacts_loaded",
}


def compile_starts(r: Results) -> Part:
    """A start-up table per model (`BENCHMARKS["starts"]`), each start against the model's cold start; the
    warm-start target judged on every warm start, a miss's first call split into its parts
    (`notes.first_call_note`)."""
    part = Part()
    for (detail, model), benchmark in BENCHMARKS["starts"].items():
        part.add(model_starts(r, detail, benchmark, model))
    return part


def model_starts(r: Results, detail: str, benchmark: str, model: str) -> Part:
    """The start-up table of `model`: its details file `detail`, its asv class `benchmark`."""
    details, reason = (
        r.details.get(detail, {}),
        r.skip_reason(detail, needs_cuda=detail in ("compile_llama_1b", "compile_llama_8b")),
    )
    if detail == "compile_user_model":  # its name, when the run recorded it, and what it is
        model += (f" {details['model']}" if details.get("model") else "") + " (a Hugging Face config.json)"
    title = f"Start-up: cold, warm, warm on a new host: {model}"
    # asv's tracks where asv ran, else the same numbers from the details file (a run without asv: no git)
    tracked = {s: {k: r.value(f"{benchmark}.track_{k}", s) for k in TRACKS["starts"]} for s in START_NAMES}
    starts = {
        s: {**details.get("entries", {}).get(s, {}), **{k: v for k, v in tracked[s].items() if v is not None}}
        for s in START_NAMES
    }
    label = r.label(
        "warm_vs_cold", device=f"; {model}" + (f" on {details['device']}" if details.get("device") else "")
    )
    cold = starts["cold"].get("first_call_seconds")
    if cold is None:
        return not_measured(title, reason, targets=[label])
    rows, measured, misses = [], [], []
    shown = {
        c: f
        for c, f in START_COLUMNS.items()  # a column the run did not record (capture on a CPU) is left out
        if f is None or any(entry.get(f) is not None for entry in starts.values())
    }
    for start, entry in starts.items():
        first, compiles, traces = (
            entry.get(k) for k in ("first_call_seconds", "inductor_compiles", "dynamo_traces")
        )
        ratio = first / cold if first is not None else None
        rows.append(
            [
                start,
                *(
                    fmt(
                        ratio if field is None else entry.get(field),
                        0 if field and not field.endswith("seconds") else 2,
                    )
                    for field in shown.values()
                ),
            ]
        )
        if start == "cold" or ratio is None:
            continue
        ok = (
            compiles == 0
            and traces in (0, None)
            and entry.get("kernel_rebuilds") in (0, None)
            and ratio <= r.limit("warm_vs_cold")
        )
        measured.append(
            (f"{start}: {ratio:.2f}× cold, {fmt(compiles, 0)} compiles, {fmt(traces, 0)} traces", ok)
        )
        misses += [] if ok else [notes.first_call_note(start, entry)]
    floor, above = details.get("entries", {}).get("floor", {}).get("process_seconds"), []
    if floor is not None and starts["cold"].get("process_seconds") is not None:
        over = {
            s: e["process_seconds"] - floor for s, e in starts.items() if e.get("process_seconds") is not None
        }
        primed, alone = (details["entries"]["floor"].get(k) for k in ("bytecode_primed", "torch_seconds"))
        pieceworks = "" if alone is None else f", {floor - alone:.2f} s of it importing pieceworks over torch"
        above = [
            f"Floor (a fresh process importing torch and pieceworks): {floor:.2f} s{pieceworks}"
            + (" (Python bytecode cached by a priming start: this installation's was not)" if primed else "")
            + ". Process seconds above it: "
            + ", ".join(f"{s} {x:.2f} s ({x / over['cold']:.2f}× cold's)" for s, x in over.items())
            + ".",
            "",
        ]
    return Part(
        [
            f"## {title}",
            "",
            f"{model} on {details.get('device', '?')}. Trace: the first call "
            "outside the backend (Dynamo's trace, or reading the serving record, and one run).",
            "",
            *md_table(["start", *shown], "l" + "r" * len(shown), rows),
            *above,
        ]
    ).add(target_row(label, measured, reason, "; ".join(n for n in misses if n), "; "))
