"""The serving section: per model and attention, decode and mixed step latency, tokens/s over each trace,
capture and pool, attention host time, a "which mode" paragraph; the serving targets' rows."""

from __future__ import annotations

import statistics

from . import notes
from .parts import Part, fmt, md_table, not_measured, own_time, ratio_text, target_row
from .results import Results

PIECEWORKS_MODES = (
    "pieceworks-piecewise",
    "pieceworks-full",
    "pieceworks-full_decode_only",
    "pieceworks-full_and_piecewise",
)
ALIKE = 0.99  # a mode whose tokens/s reach 99% of the best mode's in some round serves alike
# The field's published figures (theirs, not measured here) beside ours of the same kind: (what they measured,
# their ratio, where, (the ratio's label, a, b): ours is a's time per token over b's on the decode trace)
PUBLISHED = (
    (
        "Llama-3-8B on an RTX 4090D, 16 concurrent requests (1,024 tokens in, 256 out), TPOT: breakable "
        "22.34 ms over FULL_AND_PIECEWISE 22.09 (eager 22.64: the GPU's work dominates)",
        "1.01×",
        "vLLM PR 44275",
        ("breakable / FULL_AND_PIECEWISE", "breakable", "pieceworks-full_and_piecewise"),
    ),
    (
        "Qwen2.5-1.5B: piecewise over full",
        "1.07-1.08×",
        "vLLM PR 20059",
        ("PIECEWISE / FULL", "pieceworks-piecewise", "pieceworks-full"),
    ),
)


def serving(r: Results) -> Part:
    """Per model and attention: decode and mixed step latency, tokens/s over each trace with its ratio to
    FULL_AND_PIECEWISE, capture and pool, attention host time, PIECEWISE's host time per launch, a "which
    mode" paragraph; the serving targets' rows."""
    runs = {
        (d["model"], d["attention"]): d
        for name, d in sorted(r.details.items(), key=lambda kv: (kv[0].startswith("serving_hf"), kv[0]))
        if name.startswith("serving_") and d.get("entries")
    }
    judged: dict[str, list] = {
        k: []
        for k in (
            "attention_host_us",
            "serving_piecewise_vs_full_b1",
            "serving_piecewise_vs_full",
            "serving_piecewise_vs_breakable",
            "serving_mixed_vs_peers",
            "serving_capture_ms",
            "serving_capture_fap_ms",
        )
    }
    part = Part(
        [
            "## Serving (Llama models, bfloat16)",
            "",
            "Steps an engine serves (decode tokens, chunked prefill "
            "beside them) with paged attention as engines run it; how: docs/benchmarks.md. Step µs: median "
            "(IQR) of rounds timed side by side; ratios: median of the per-round ratios (range).",
            "",
        ]
        if runs
        else []
    )
    part.add(which_mode_summary(runs))
    for (model, attention), d in runs.items():
        part.add(serving_run(r, model, attention, d, judged))
    reason = next(
        (d["skip"] for name, d in r.details.items() if name.startswith("serving_") and d.get("skip")), None
    ) or r.skip_reason("serving_llama_1b_unified")
    if not runs:
        part.add(not_measured("Serving (Llama models, bfloat16)", reason))
    for key, found in judged.items():
        limit = r.limit(key)
        worst = worst_explained(found, limit)
        part.add(
            target_row(
                r.label(key),
                [(text, value <= limit) for text, value, _ in found],
                reason,
                "; ".join(dict.fromkeys(note for *_, note in worst if note)),
            )
        )
    return part


def serving_run(r: Results, model: str, attention: str, d: dict, judged: dict[str, list]) -> Part:
    """One serving run's tables and paragraphs; adds what the serving targets judge to `judged`."""
    entries, name = d["entries"], f"{model}, {attention} attention"
    impls = [
        i
        for i in dict.fromkeys([*d.get("implementations", []), *(k.split("|")[0] for k in entries)])
        if any("median_us" in v or "tokens_per_s" in v for k, v in entries.items() if k.startswith(i + "|"))
    ]

    def cell(i: str, case: str) -> str:
        e = entries.get(f"{i}|{case}", {})
        return f"{e['median_us']:.0f} ({e['iqr_us']:.0f})" if "median_us" in e else "n/a"

    def ratio(case: str, a: str, b: str) -> dict | None:
        return d.get("ratios", {}).get(case, {}).get(f"{a} / {b}")

    lines = [
        f"### {name}",
        "",
        *(
            [f"A partial run ({d['partial']}: its time limit): what follows it is not measured.", ""]
            if d.get("partial")
            else []
        ),
    ]
    for kind, cases in (
        ("decode", [f"decode b{b}" for b in d["decode_batches"]]),
        ("mixed", [f"mixed {n} tokens" for n in d["mixed_tokens"]]),
    ):
        ratios = [
            ("PIECEWISE / FULL", "pieceworks-piecewise", "pieceworks-full"),
            ("PIECEWISE / breakable", "pieceworks-piecewise", "breakable"),
            ("FULL_AND_PIECEWISE / FULL", "pieceworks-full_and_piecewise", "pieceworks-full"),
        ]
        rows = []
        for case in cases:
            found = [(label, ratio(case, a, b)) for label, a, b in ratios]
            rows.append(
                [
                    case.split(" ", 1)[1],
                    *(cell(i, case) for i in impls),
                    *(ratio_text(x["median"], x) if x else "n/a" for _, x in found),
                ]
            )
            if kind == "decode" and attention == "unified":
                batch = int(case.split("b")[1])
                x = dict(found)["PIECEWISE / FULL"]
                key = "serving_piecewise_vs_full_b1" if batch == 1 else "serving_piecewise_vs_full"
                if x and (batch == 1 or batch >= 8):
                    judged[key].append(
                        (
                            f"{model} b{batch}: {ratio_text(x['median'], x)}",
                            x["median"],
                            notes.serving_note(d, case, name),
                        )
                    )
            if kind == "decode" and (x := dict(found)["PIECEWISE / breakable"]):
                judged["serving_piecewise_vs_breakable"].append(
                    (
                        f"{name} b{case.split('b')[1]}: {ratio_text(x['median'], x)}",
                        x["median"],
                        notes.serving_note(d, case, name, "breakable"),
                    )
                )
        lines += [
            f"{kind.title()} steps, µs per step:",
            "",
            *md_table(
                ["batch" if kind == "decode" else "tokens", *impls, *(label for label, _, _ in ratios)],
                "r" * (1 + len(impls) + len(ratios)),
                rows,
            ),
        ]
    traces, builds = d.get("traces", {}), d.get("builds", {})
    base = "pieceworks-full_and_piecewise"
    rows = []
    for i in impls:
        row = [i]
        for trace in traces:
            spread = _spread(entries, i, base, trace)
            row += [
                fmt(entries.get(f"{i}|{trace} trace", {}).get("tokens_per_s"), 0),
                f"{spread[0]:.3f}× ({spread[1]:.3f}-{spread[2]:.3f})" if spread else "n/a",
            ]
            if trace == "mixed" and spread and i != base and not i.startswith("pieceworks"):
                judged["serving_mixed_vs_peers"].append((f"{name}: {i} {spread[0]:.3f}×", spread[0], ""))
        b = builds.get(i, {})
        row += [fmt(b.get("capture_ms_per_size")), fmt(b.get("pool_mib"))]
        rows.append(row)
        mode = {
            "pieceworks-piecewise": "PIECEWISE",
            "pieceworks-full_and_piecewise": "FULL_AND_PIECEWISE",
        }.get(i)
        if mode and model in ("llama_1b", "llama_8b") and b.get("capture_ms_per_size") is not None:
            judged["serving_capture_ms" if mode == "PIECEWISE" else "serving_capture_fap_ms"].append(
                (
                    f"{name}: {b['capture_ms_per_size']:.1f} ms",
                    b["capture_ms_per_size"],
                    notes.capture_note(r, model, mode),
                )
            )
    lines += [
        "Traces, tokens/s (and over FULL_AND_PIECEWISE's, per-round range); capture ms per size; graph pool "
        "MiB: "
        + "; ".join(
            f"{t}: {v['steps']} steps, {v['tokens']} tokens "
            f"({', '.join(f'{n} {k}' for k, n in v['kinds'].items())})"
            for t, v in traces.items()
        ),
        "",
        *md_table(
            [
                "implementation",
                *(f"{t} {c}" for t in traces for c in ("tok/s", "ratio")),
                "capture ms/size",
                "pool MiB",
            ],
            "l" + "r" * (2 * len(traces) + 2),
            rows,
        ),
    ]
    host = d.get("attention_host_us", {})
    for case, h in host.items():
        if case == "decode b1":
            found = d.get("attention_host_profile", {})
            calls = found.get("op_calls", 100)  # the op's calls profiled (100 where a run did not record it)
            per_call = [
                {**p, "us": 1e6 * p["tottime_s"] / calls, "per_call": p["calls"] / calls}
                for p in found.get("top", [])
            ]
            judged["attention_host_us"].append(
                (
                    f"{name}: {h['median_us']:.1f} µs",
                    h["median_us"],
                    f"{name}, "
                    f"{calls} calls under cProfile, own time a call: "
                    + own_time(per_call, "us", "µs", "per_call"),
                )
            )
    gaps = d.get("piecewise_launch_gaps", {})
    lines += [
        "Attention op host µs per call: "
        + ", ".join(f"{c} {h['median_us']:.1f} (IQR {h['iqr_us']:.1f})" for c, h in host.items())
        + ". PIECEWISE's own host time (call span outside graph launches and attention calls, profiler "
        "included): "
        + ", ".join(
            f"{b}: {g['gaps_us']:.0f} µs of a {g['call_us']:.0f} µs call over "
            f"{g['launches']:.0f} launches, {g['gap_us_per_launch']:.1f} µs each"
            for b, g in gaps.items()
        )
        + ".",
        "",
    ]
    not_served = {
        k.split("|")[0]: v["skip"] for k, v in entries.items() if "cannot serve" in v.get("skip", "")
    }
    lines += [f"Cannot serve here: {'; '.join(f'{i}: {why}' for i, why in not_served.items())}.", ""] * bool(
        not_served
    )
    lines += [which_mode(name, entries, traces), ""]
    plot = {i: (list(traces), [_spread(entries, i, base, t) for t in traces]) for i in impls if i != base}
    return Part(
        lines, plots=[(f"serving_{model}_{attention}.png", f"{name}: tokens/s ÷ FULL_AND_PIECEWISE's", plot)]
    )


def _spread(entries: dict, impl: str, base: str, trace: str) -> tuple | None:
    mine = entries.get(f"{impl}|{trace} trace", {}).get("round_tokens_per_s")
    ref = entries.get(f"{base}|{trace} trace", {}).get("round_tokens_per_s")
    if not mine or not ref:
        return None
    ratios = sorted(a / b for a, b in zip(mine, ref))
    return statistics.median(ratios), ratios[0], ratios[-1]


def which_mode(name: str, entries: dict, traces: dict) -> str:
    """The "which mode" paragraph of one run, from its numbers alone."""
    said = []
    for trace in traces:
        found = {
            i: e["tokens_per_s"]
            for k, e in entries.items()
            if k.endswith(f"|{trace} trace") and "tokens_per_s" in e
            for i in [k.split("|")[0]]
        }
        if not found:
            continue
        best = max(found, key=found.__getitem__)
        modes = {i: found[i] / found[best] for i in PIECEWORKS_MODES if i in found}
        top = max(modes, key=modes.__getitem__) if modes else None
        said.append(
            f"on the {trace} trace {best} serves most tokens/s ({found[best]:,.0f})"
            + (f"; of pieceworks' modes {_mode(top)} ({modes[top]:.1%} of it)" if top else "")
            + "".join(f", {_mode(i)} {m:.1%}" for i, m in modes.items() if i != top)
        )
    return f"Which mode ({name}): " + "; ".join(said) + "." if said else ""


def _mode(impl: str) -> str:
    return impl.split("-", 1)[1].upper()


def alike(entries: dict, trace: str) -> list[tuple[str, float]]:
    """pieceworks' modes that serve `trace` alike, most tokens/s first, each with its tokens/s over the
    best's (median of the rounds): the best, and each mode whose tokens/s reach `ALIKE` of the best's in some
    round (in the run's one reading where it recorded no rounds)."""
    found = {
        i: e["tokens_per_s"]
        for i in PIECEWORKS_MODES
        if "tokens_per_s" in (e := entries.get(f"{i}|{trace} trace", {}))
    }
    if not found:
        return []
    best = max(found, key=found.__getitem__)
    ratios = {i: _spread(entries, i, best, trace) or (v / found[best],) * 3 for i, v in found.items()}
    return [(i, ratios[i][0]) for i in sorted(found, key=lambda i: -found[i]) if ratios[i][2] >= ALIKE]


def which_mode_summary(runs: dict) -> Part:
    """The answer first: per model and attention, the modes that serve each trace alike and those alike on
    both (the mode to serve with); then the field's published figures beside ours of the same kind."""
    if not runs:
        return Part()
    rows = []
    for (model, attention), d in runs.items():
        per_trace = {t: alike(d["entries"], t) for t in ("decode", "mixed")}
        both = [i for i, _ in per_trace["mixed"] if i in dict(per_trace["decode"])]
        rows.append(
            [
                f"{model}, {attention}",
                *(
                    ", ".join(f"{_mode(i)} {x:.1%}" for i, x in found) or "n/a"
                    for found in per_trace.values()
                ),
                ", ".join(map(_mode, both))
                or "; ".join(f"{t}: {_mode(found[0][0])}" for t, found in per_trace.items() if found),
            ]
        )
    lines = [
        "### Which mode on this GPU",
        "",
        f"pieceworks' modes that serve each trace alike (tokens/s within {1 - ALIKE:.0%} of the best mode's "
        "in some round; % of the best's, median of the rounds), and the modes alike on both traces: the "
        "mode to serve with.",
        "",
        *md_table(["model, attention", "decode trace", "mixed trace", "serve with"], "llll", rows),
        "Published figures (theirs, measured elsewhere) beside ours of the same kind: time per token on the "
        "decode trace (median of the rounds, range).",
        "",
    ]
    published = []
    for what, theirs, where, (label, a, b) in PUBLISHED:
        ours = [
            f"{model}, {attention}: {ratio_text(x[0], {'min': x[1], 'max': x[2]})}"
            for (model, attention), d in runs.items()
            if (x := _spread(d["entries"], b, a, "decode"))
        ]
        published.append([what, theirs, where, f"{label}: " + (", ".join(ours) or "n/a")])
    lines += md_table(["published", "theirs", "source", "ours, this GPU"], "lrll", published)
    return Part(lines)


def worst_explained(found: list[tuple[str, float, str]], limit: float, count: int = 2) -> list:
    """Of `found` ((text, value, note) of each run judged), the `count` worst misses over `limit` that carry
    a note, one per note: a worse miss no profile explains (a model the memory run did not measure) leaves
    its place to the next, and so does a miss whose note a worse one already gives (the same model served
    with the other attention), so that each model's miss is explained."""
    by_note: dict[str, tuple[str, float, str]] = {}
    for f in sorted((f for f in found if f[1] > limit and f[2]), key=lambda f: -f[1]):
        by_note.setdefault(f[2], f)
    return list(by_note.values())[:count]
