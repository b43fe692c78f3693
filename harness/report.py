"""The benchmark report: target verdicts, tables and plots, regenerated from result files; it measures nothing.

`python -m pieceworks.harness.report --machine NAME` reads asv's results of that machine and `results/bench/NAME/`
(docs/benchmarks.md says which files) and writes `REPORT.md` and `plots/*.png` (matplotlib) there.

Contracts: every ratio comes from numbers of one run; a section without numbers says "not measured here" and why;
one report is one commit's run (the newest, unless `--commit` names another): result files of other commits are left
out; the header says "committed" only where git tracks every result file read unmodified; the targets, their limits and
labels are ci/thresholds.json's "targets" and "own_checks", reported, never asserted.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime
import glob
import json
import math
import os
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable
from typing import Any

from pieceworks.gate.results import ResultSetError, is_number, newest_runs, result_files, values_of
from pieceworks.gate.thresholds import DEFAULT_PATH

__all__ = ["Part", "Results", "load_results", "main", "newest", "render", "result_files_source"]

DOCS = "../../../docs/benchmarks.md"  # how each number was measured, from results/bench/<machine>/REPORT.md
NEWEST = ("runtime_breakdown",)  # `<kind>_<label>.json` runs: only the newest of each kind is read
LATENCY_TABLES = {(m, d): f"latency.{name}" for (m, d), name in {
    ("toy_llama", "bfloat16"): "ToyLlamaBfloat16", ("toy_llama", "float32"): "ToyLlamaFloat32",
    ("silly", "bfloat16"): "SillyBfloat16", ("silly", "float32"): "SillyFloat32",
    ("llama_1b", "bfloat16"): "Llama1BBfloat16", ("llama_8b_4l", "bfloat16"): "Llama8B4LayersBfloat16"}.items()}
LATENCY_TABLES["llama_8b_4l_tp2", "bfloat16"] = "tensor_parallel.TensorParallelLlama8B4LayersBfloat16"  # 2 GPUs
LATENCY_TARGETS = ("piecewise_vs_pcg", "piecewise_vs_breakable", "piecewise_vs_full", "full_vs_reduce_overhead")
MEMORY_RUNS = {"CaptureMemory": ("toy_llama", "ToyLlama 12 layers"), "CaptureMemoryLlama1B": ("llama_1b", "Llama 1B")}
START_COLUMNS = {"first call s": "first_call_seconds", "vs cold": None, "trace s": "trace_seconds",  # {column: field}
                 "split s": "split_seconds", "load s": "load_seconds", "compile s": "compile_seconds",
                 "capture s": "capture_seconds", "process s": "process_seconds", "Inductor compiles": "inductor_compiles",
                 "kernel rebuilds": "kernel_rebuilds", "traces": "dynamo_traces", "artifacts loaded": "artifacts_loaded"}
FIRST_CALL_PARTS = ("first_call", "trace", "split", "load", "compile")  # a start's <part>_seconds


@dataclasses.dataclass
class Results:
    """One machine's result files, read once (`load_results`)."""

    asv: dict[str, dict[tuple, Any]]  # {benchmark: {params: value, None where skipped or failed}}
    commit: str  # the commit every number comes from
    details: dict[str, Any]  # results/bench/<machine>/<name>.json by name; the NEWEST kinds' runs by kind
    pytest_benchmark: dict  # host_overhead.json, {} where absent
    files: list[str]  # the result files read (what "committed" is judged on)
    others: int  # result files of the machine's other commits, left out
    targets: dict[str, dict]  # the thresholds file's "targets" and "own_checks", by key
    environment: dict  # the suites' record of the machine (device, driver, versions, date)

    def value(self, name: str, *key: Any) -> Any:
        return self.asv.get(name, {}).get(tuple(key))

    def limit(self, key: str) -> float:
        return self.targets[key]["limit"]

    def label(self, key: str, field: str = "label", **extra: str) -> str:
        return self.targets[key][field].format(limit=self.limit(key), **extra)

    def skip_reason(self, detail: str, needs_cuda: bool = True) -> str:
        """Why `detail`'s benchmark has no numbers: the reason it recorded, else what this machine lacks."""
        if self.details.get(detail, {}).get("skip"):
            return self.details[detail]["skip"]
        if needs_cuda and self.environment.get("device") == "cpu":
            return "needs CUDA: this machine has no CUDA device"
        return f"not run at commit {self.commit[:12]} on this machine"


def newest(details: dict[str, Any], kind: str) -> dict | None:
    """Removes every `<kind>_<label>` run from `details` and returns the newest by its recorded date (then label),
    its "commit" defaulting to the label; None where there is none."""
    runs = {name[len(kind) + 1:]: details.pop(name) for name in sorted(details) if name.startswith(kind + "_")}
    label = max(runs, key=lambda found: (str(runs[found].get("date", "")), found), default=None)
    return None if label is None else {"commit": label, **runs[label]}


def recorded_run(doc: dict[str, Any]) -> tuple[str, str]:
    """(commit, date) a details file records ("" where it records none): the suites' in their environment, the
    runtime breakdown at its top, pytest-benchmark's in its commit_info."""
    where = doc.get("environment") if isinstance(doc.get("environment"), dict) and "commit" in doc["environment"] \
        else doc
    commit = where.get("commit") or (doc.get("commit_info") or {}).get("id") or ""
    return str(commit), str(where.get("date") or doc.get("datetime") or "")


def load_results(results: str, machine: str, commit: str | None = None, targets: str = DEFAULT_PATH) -> Results:
    """One run of `machine`: the asv results (`results`/asv/`machine`) and details files (`results`/bench/`machine`,
    of each NEWEST kind the newest, under the kind's name) of `commit`, by default the newest commit measured there
    (by the dates the details files and asv's runs record); files of other commits, or recording none, are left out
    and counted in `others`. Also the thresholds file `targets`. ResultSetError where that commit has no result files."""
    try:
        files = result_files(os.path.join(results, "asv", machine))
    except ResultSetError:
        files = []
    details = {}
    for path in (bench := sorted(glob.glob(os.path.join(results, "bench", machine, "*.json")))):
        with open(path) as f:
            details[os.path.splitext(os.path.basename(path))[0]] = json.load(f)
    recorded = {name: recorded_run(doc) for name, doc in details.items()}  # {name: (commit, date)}
    if commit is None:
        started = [(datetime.datetime.fromtimestamp(run[0] / 1e3, datetime.timezone.utc).isoformat(timespec="seconds"),
                    run[2]["commit_hash"]) for run in (newest_runs(files) if files else {}).values()]
        commit = max([(d, c) for c, d in recorded.values() if c] + started, default=(None, None))[1]
    ours = [f for f in files if commit and os.path.basename(f).startswith(commit[:8])]
    mine = {name for name, (c, _) in recorded.items() if commit and len(c) >= 7 and c[:7] == commit[:7]}
    if not ours and not mine:
        raise ResultSetError(f"{results}: no result files of machine {machine}"
                             + (f" and commit {commit}" if commit else ""))
    runs = newest_runs(ours) if ours else {}
    asv = {name: {tuple(map(ast.literal_eval, combo)): v if is_number(v) else None
                  for combo, v, _ in values_of(path, doc, name)} for name, (_, path, doc) in runs.items()}
    details = {name: doc for name, doc in details.items() if name in mine}
    details.update({kind: doc for kind in NEWEST if (doc := newest(details, kind)) is not None})
    with open(targets, encoding="utf-8") as f:
        table = json.load(f)
    environment = details.get("environment") or next((d for d in details.values() if "environment" in d), {})
    return Results(asv, commit, details, details.pop("host_overhead", {}), ours + [
        p for p in bench if os.path.splitext(os.path.basename(p))[0] in mine],
        len(files) - len(ours) + len(recorded) - len(mine),
        {**table["targets"], **table["own_checks"]}, environment.get("environment", {}))


@dataclasses.dataclass
class Part:
    """What a section adds: Markdown lines, target and own-check rows (what, measured, verdict, note), and latency
    plots (file name, title, {implementation: (batch sizes, µs or None)})."""

    lines: list[str] = dataclasses.field(default_factory=list)
    targets: list[tuple[str, str, str, str]] = dataclasses.field(default_factory=list)
    own_checks: list[tuple[str, str, str, str]] = dataclasses.field(default_factory=list)
    plots: list[tuple[str, str, dict]] = dataclasses.field(default_factory=list)

    def add(self, other: Part) -> Part:
        for field in dataclasses.fields(self):
            getattr(self, field.name).extend(getattr(other, field.name))
        return self


def _fmt(value: Any, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _ratio(ratio: float | None, spread: dict | None, digits: int = 2) -> str:
    """"1.12× (1.05-1.20)": a ratio with its per-round range where it has one."""
    return f"{_fmt(ratio, digits)}×" + (f" ({spread['min']:.{digits}f}-{spread['max']:.{digits}f})" if spread else "")


def _table(columns: list[str], align: str, rows: Iterable[Iterable[Any]]) -> list[str]:
    """A Markdown table, column i aligned left or right as `align`[i] is "l" or "r", and a blank line."""
    row = lambda cells: "| " + " | ".join(map(str, cells)) + " |"  # noqa: E731
    return [row(columns), "|" + "".join("---:|" if a == "r" else "---|" for a in align), *map(row, rows), ""]


def _own_time(found: list[dict], key: str, unit: str, calls: str = "calls") -> str:
    """"`function` 1.2 µs in 3 calls, ..." for the first five functions of a cProfile summary."""
    return ", ".join(f"`{p['function']}` {p[key]:.{1 if unit == 'µs' else 2}f} {unit} in {p[calls]:g} calls"
                     for p in found[:5])


def not_measured(what: str, reason: str, heading: bool = True, targets: Iterable[str] = ()) -> Part:
    """`what` has no numbers here, and neither have the `targets` (labels) it judges: a section of its own (`heading`:
    "## what", "Not measured here (reason).") or a line of a section that has others ("what: not measured here
    (reason)."); never a method text over no table."""
    line = f"Not measured here ({reason})." if heading else f"{what}: not measured here ({reason})."
    return Part([f"## {what}", ""] * heading + [line, ""], targets=[(t, reason, "not measured", "") for t in targets])


def target_row(label: str, measured: list[tuple[str, bool]], reason: str, note: str = "", sep: str = ", ") -> Part:
    """A target's row: each measured value's text, met where every one is within the target; "not measured" and
    `reason` where nothing was measured."""
    if not measured:
        return Part(targets=[(label, reason, "not measured", "")])
    met = all(ok for _, ok in measured)
    return Part(targets=[(label, sep.join(text for text, _ in measured), "met" if met else "**missed**", note)])


def ratio_row(r: Results, key: str, found: list[tuple], reason: str, explain: Callable[[str, Any], str],
              field: str = "label") -> Part:
    """The row of target ratio `key` (its `field` label) from (dtype, batch, ratio or None, per-round spread or None)
    of one run; the note explains the three worst misses by `explain(dtype, batch)`, each text once."""
    found = [(d, b, x, s) for d, b, x, s in found if x is not None]
    worst = sorted((f for f in found if f[2] > r.limit(key)), key=lambda f: -f[2])[:3]
    note = "; ".join(dict.fromkeys(filter(None, (explain(d, b) for d, b, _, _ in worst))))
    return target_row(r.label(key, field), [(f"{d} b{b}: {_ratio(x, s)}", x <= r.limit(key)) for d, b, x, s in found],
                      reason, note)


def latency(r: Results) -> Part:
    """A table per model and dtype, the kernel profiles, and a row per target ratio judged on its "models" (batches
    from its "min_batch"), misses explained by `profile_note`."""
    worst: dict[str, list] = {key: [] for key in LATENCY_TARGETS}  # (model and dtype, batch, ratio, per-round spread)
    tables = {(m, d): latency_table(r, m, d, worst) for m, d in LATENCY_TABLES}
    reason = r.skip_reason("latency_toy_llama_bfloat16")
    if not any(t.lines for t in tables.values()):
        part = not_measured("Latency", reason)
    else:
        part = Part(["## Latency", "", "Median µs per forward (IQR); each ratio from its table's run.", ""])
        for (m, d), table in tables.items():
            part.add(table if table.lines else not_measured(f"{m} {d}", r.skip_reason(f"latency_{m}_{d}"), False))
    for key, found in worst.items():
        part.add(ratio_row(r, key, found, reason, lambda w, b, key=key: profile_note(r, w, b, r.targets[key]["sides"])))
    return part.add(kernel_profiles(r))


def latency_table(r: Results, model: str, dtype: str, worst: dict[str, list]) -> Part:
    """One latency class's table with the target ratios whose sides it timed, the implementations it could not time
    and why, and its plot (nothing where nothing was measured); adds the ratios its model is judged on to `worst`."""
    name = f"{LATENCY_TABLES[model, dtype]}.track_"
    found, iqr = r.asv.get(name + "median_us", {}), r.asv.get(name + "iqr_us", {})
    details = r.details.get(f"latency_{model}_{dtype}", {})
    batches = sorted({k[1] for k in found})
    present = [i for i in dict.fromkeys(k[0] for k in found) if any(found.get((i, b)) is not None for b in batches)]
    if not present:
        return Part()
    targets = [k for k in LATENCY_TARGETS if set(r.targets[k]["sides"]) <= set(present)]
    rows = [[b, *("n/a" if found.get((i, b)) is None else f"{found[i, b]:.0f} ({_fmt(iqr.get((i, b)), 0)})"
                  for i in present)] for b in batches]
    for row, b in zip(rows, batches):
        for key, t in ((k, r.targets[k]) for k in targets):
            in_rounds = details.get("ratios", {}).get(str(b), {}).get(t["ratio"])
            ratio, spread = latency_ratio(in_rounds, *(found.get((i, b)) for i in t["sides"]))
            row.append(_ratio(ratio, spread))
            judged = model in t["models"] and b >= t.get("min_batch", 0)
            worst[key] += [(f"{model} {dtype}", b, ratio, spread)] * judged
    lines = [f"### {model}, {dtype}", "", *_table(["batch", *present, *(r.targets[k]["ratio"] for k in targets)],
                                                   "r" * (len(present) + len(targets) + 1), rows)]
    if rounds := details.get("side_by_side"):
        lines += [f"Timed side by side in {details.get('rounds')} rotating rounds: {', '.join(rounds)}; the others "
                  "each alone, before them.", ""]
    failed = {k.split("|")[0]: e.get("skip") or f"error: {e['error']}" for k, e in details.get("entries", {}).items()
              if "skip" in e or "error" in e}  # an implementation skipped, or failed against eager, and why
    lines += [f"Not timed (n/a): {'; '.join(f'{i}: {why}' for i, why in failed.items())}.", ""] * bool(failed)
    if pools := details.get("pool_mib_by_rank"):  # tensor parallel: rank 0's times, each rank's graph pool
        lines += ["Times of rank 0. Graph pool MiB after the capture: " + "; ".join(
            f"rank {n}: " + ", ".join(f"{i} {mib:.0f}" for i, mib in p.items()) for n, p in enumerate(pools)) + ".", ""]
    return Part(lines, plots=[(f"latency_{model}_{dtype}.png", f"{model}, {dtype}: latency vs batch",
                               {i: (batches, [found.get((i, b)) for b in batches]) for i in present})])


def latency_ratio(in_rounds: dict | None, top: float | None, bottom: float | None) -> tuple[float | None, Any]:
    """(ratio, its per-round spread or None): the median of the per-round ratios where the run timed both sides in
    rotating rounds, else (a run that timed each in turn) one median over the other."""
    if in_rounds:
        return in_rounds["median"], in_rounds
    return (top / bottom if top and bottom else None), None


def profile_note(r: Results, where: str, batch: int, impls: list[str]) -> str:
    """Where a missed ratio's time goes, from the latency run (`where`: "<model> <dtype>") kernel profiles of both
    sides: "A 255 µs, kernels 225 µs (88% busy) vs B ...; kernels only in A: ..."; a line saying so where it did not
    profile both."""
    from pieceworks.harness.profile import kernels_only_in

    run = r.details.get(f"latency_{where.replace(' ', '_')}", {})
    profiles = [run.get("profiles", {}).get(f"{i}|{batch}") for i in impls]
    if not all(profiles):
        return f"{where} b{batch}: no kernel profile of both sides recorded"
    medians = [run.get("entries", {}).get(f"{i}|{batch}", {}).get("median_us") for i in impls]
    only = ", ".join(f"`{name[:48]}` {us:.1f} µs in {calls:.0f} launches" for name, us, calls in
                     kernels_only_in(*profiles))
    return f"{where} b{batch}: " + " vs ".join(
        f"{i} {_fmt(m, 0)} µs, kernels {p['device_us_per_call']:.0f} µs "
        f"({_fmt(m and 100 * p['device_us_per_call'] / m, 0)}% busy)" for i, m, p in zip(impls, medians, profiles)
    ) + (f"; kernels only in {impls[0]}: {only}" if only else "")


def kernel_profiles(r: Results) -> Part:
    """The latency runs' kernel profiles: kernel µs per forward and the library kernels' share of them, a row per
    model, dtype and batch, a column per implementation profiled."""
    rows: dict[tuple[str, str, int], dict[str, str]] = {}
    for model, dtype in LATENCY_TABLES:
        for key, p in r.details.get(f"latency_{model}_{dtype}", {}).get("profiles", {}).items():
            if "device_us_per_call" in p:
                impl, batch = key.split("|")
                rows.setdefault((model, dtype, int(batch)), {})[impl] = \
                    f"{p['device_us_per_call']:.0f} ({p['library_share']:.0%})"
    impls = list(dict.fromkeys(i for row in rows.values() for i in row))
    return Part(["### Kernel profiles", "", "Kernel µs per forward (library kernels' share).", "",
                 *_table(["model", "dtype", "batch", *impls], "llr" + "r" * len(impls),
                         ([*k, *(row.get(i, "n/a") for i in impls)] for k, row in sorted(rows.items(), key=lambda kv: (
                             list(LATENCY_TABLES).index(kv[0][:2]), kv[0][2]))))] if rows else [])


MEMORY_COLUMNS = {"pool_mib": "pool", "estimate_mib": "estimate", "reserved_delta_mib": "reserved Δ",
                  "nvml_used_delta_mib": "NVML used Δ", "unshared_pool_mib": "unshared pool",
                  "unshared_reserved_delta_mib": "unshared reserved Δ", "unshared_nvml_used_delta_mib": "unshared NVML Δ",
                  "capture_seconds": "capture s"}
MEMORY_SUBJECTS = ("PIECEWISE", "FULL", "meta-pcg", "breakable")  # pieceworks' modes, then the peers


PIECEWORKS_MODES = ("pieceworks-piecewise", "pieceworks-full", "pieceworks-full_decode_only",
                    "pieceworks-full_and_piecewise")


def serving(r: Results) -> Part:
    """Per model and attention: decode and mixed step latency, tokens/s over each trace with its ratio to
    FULL_AND_PIECEWISE, capture and pool, attention host time, PIECEWISE's host time per launch, a "which mode"
    paragraph; the serving targets' rows."""
    runs = {(d["model"], d["attention"]): d for name, d in sorted(r.details.items(), key=lambda kv: (
        kv[0].startswith("serving_hf"), kv[0])) if name.startswith("serving_") and d.get("entries")}
    judged: dict[str, list] = {k: [] for k in ("attention_host_us", "serving_piecewise_vs_full_b1",
                                               "serving_piecewise_vs_full", "serving_piecewise_vs_breakable",
                                               "serving_mixed_vs_peers", "serving_capture_ms")}
    part = Part(["## Serving (Llama models, bfloat16)", "", "Steps an engine serves (decode tokens, chunked prefill "
                 "beside them) with paged attention as engines run it; how: docs/benchmarks.md. Step µs: median "
                 "(IQR) of rounds timed side by side; ratios: median of the per-round ratios (range).", ""]
                if runs else [])
    for (model, attention), d in runs.items():
        part.add(serving_run(r, model, attention, d, judged))
    reason = next((d["skip"] for name, d in r.details.items() if name.startswith("serving_") and d.get("skip")),
                  None) or r.skip_reason("serving_llama_1b_unified")
    if not runs:
        part.add(not_measured("Serving (Llama models, bfloat16)", reason))
    for key, found in judged.items():
        limit = r.limit(key)
        worst = sorted((f for f in found if f[1] > limit), key=lambda f: -f[1])[:2]
        part.add(target_row(r.label(key), [(text, value <= limit) for text, value, _ in found], reason,
                            "; ".join(dict.fromkeys(note for *_, note in worst if note))))
    return part


def serving_note(d: dict, case: str, name: str, other: str = "pieceworks-full") -> str:
    """Where PIECEWISE's time goes against `other` at `case`, from the run's kernel profiles of both."""
    from pieceworks.harness.profile import kernels_only_in

    sides = ("pieceworks-piecewise", other)
    profiles = [d.get("profiles", {}).get(f"{i}|{case}") for i in sides]
    if not all(profiles):
        return f"{name} {case}: no kernel profile of both sides recorded"
    medians = [d["entries"].get(f"{i}|{case}", {}).get("median_us") for i in sides]
    only = ", ".join(f"`{n[:48]}` {us:.1f} µs in {c:.0f} launches" for n, us, c in kernels_only_in(*profiles))
    return f"{name} {case}: " + " vs ".join(
        f"{i} {_fmt(m, 0)} µs, kernels {p['device_us_per_call']:.0f} µs "
        f"({_fmt(m and 100 * p['device_us_per_call'] / m, 0)}% busy)" for i, m, p in zip(sides, medians, profiles)
    ) + (f"; kernels only in PIECEWISE: {only}" if only else "")


def serving_run(r: Results, model: str, attention: str, d: dict, judged: dict[str, list]) -> Part:
    entries, name = d["entries"], f"{model}, {attention} attention"
    impls = [i for i in dict.fromkeys([*d.get("implementations", []), *(k.split("|")[0] for k in entries)])
             if any("median_us" in v or "tokens_per_s" in v for k, v in entries.items() if k.startswith(i + "|"))]
    cell = lambda i, case: (f"{e['median_us']:.0f} ({e['iqr_us']:.0f})" if "median_us" in (  # noqa: E731
        e := entries.get(f"{i}|{case}", {})) else "n/a")
    ratio = lambda case, a, b: d.get("ratios", {}).get(case, {}).get(f"{a} / {b}")  # noqa: E731
    lines = [f"### {name}", "", *([f"A partial run ({d['partial']}: its time limit): what follows it is not measured.",
                                   ""] if d.get("partial") else [])]
    for kind, cases in (("decode", [f"decode b{b}" for b in d["decode_batches"]]),
                        ("mixed", [f"mixed {n} tokens" for n in d["mixed_tokens"]])):
        ratios = [("PIECEWISE / FULL", "pieceworks-piecewise", "pieceworks-full"),
                  ("PIECEWISE / breakable", "pieceworks-piecewise", "breakable"),
                  ("FULL_AND_PIECEWISE / FULL", "pieceworks-full_and_piecewise", "pieceworks-full")]
        rows = []
        for case in cases:
            found = [(label, ratio(case, a, b)) for label, a, b in ratios]
            rows.append([case.split(" ", 1)[1], *(cell(i, case) for i in impls),
                         *(_ratio(x["median"], x) if x else "n/a" for _, x in found)])
            if kind == "decode" and attention == "unified":
                batch = int(case.split("b")[1])
                x = dict(found)["PIECEWISE / FULL"]
                key = "serving_piecewise_vs_full_b1" if batch == 1 else "serving_piecewise_vs_full"
                if x and (batch == 1 or batch >= 8):
                    judged[key].append((f"{model} b{batch}: {_ratio(x['median'], x)}", x["median"],
                                        serving_note(d, case, name)))
            if kind == "decode" and (x := dict(found)["PIECEWISE / breakable"]):
                judged["serving_piecewise_vs_breakable"].append((f"{name} b{case.split('b')[1]}: "
                                                                 f"{_ratio(x['median'], x)}", x["median"],
                                                                 serving_note(d, case, name, "breakable")))
        lines += [f"{kind.title()} steps, µs per step:", "", *_table(
            ["batch" if kind == "decode" else "tokens", *impls, *(label for label, _, _ in ratios)],
            "r" * (1 + len(impls) + len(ratios)), rows)]
    traces, builds = d.get("traces", {}), d.get("builds", {})
    base = "pieceworks-full_and_piecewise"
    rows = []
    for i in impls:
        row = [i]
        for trace in traces:
            spread = _spread(entries, i, base, trace)
            row += [_fmt(entries.get(f"{i}|{trace} trace", {}).get("tokens_per_s"), 0),
                    f"{spread[0]:.3f}× ({spread[1]:.3f}-{spread[2]:.3f})" if spread else "n/a"]
            if trace == "mixed" and spread and i != base and not i.startswith("pieceworks"):
                judged["serving_mixed_vs_peers"].append((f"{name}: {i} {spread[0]:.3f}×", spread[0], ""))
        b = builds.get(i, {})
        row += [_fmt(b.get("capture_ms_per_size")), _fmt(b.get("pool_mib"))]
        rows.append(row)
        if i == "pieceworks-piecewise" and model == "llama_1b" and b.get("capture_ms_per_size") is not None:
            judged["serving_capture_ms"].append((f"{name}: {b['capture_ms_per_size']:.1f} ms",
                                                 b["capture_ms_per_size"], capture_note(r, model, "PIECEWISE")))
    lines += ["Traces, tokens/s (and over FULL_AND_PIECEWISE's, per-round range); capture ms per size; graph pool MiB: "
              + "; ".join(f"{t}: {v['steps']} steps, {v['tokens']} tokens ({', '.join(f'{n} {k}' for k, n in v['kinds'].items())})"
                          for t, v in traces.items()), "",
              *_table(["implementation", *(f"{t} {c}" for t in traces for c in ("tok/s", "ratio")), "capture ms/size",
                       "pool MiB"], "l" + "r" * (2 * len(traces) + 2), rows)]
    host = d.get("attention_host_us", {})
    for case, h in host.items():
        if case == "decode b1":
            found = d.get("attention_host_profile", {})
            calls = found.get("op_calls", 100)  # the op's calls profiled (100 where a run did not record it)
            per_call = [{**p, "us": 1e6 * p["tottime_s"] / calls, "per_call": p["calls"] / calls}
                        for p in found.get("top", [])]
            judged["attention_host_us"].append((f"{name}: {h['median_us']:.1f} µs", h["median_us"], f"{name}, "
                                                f"{calls} calls under cProfile, own time a call: "
                                                + _own_time(per_call, "us", "µs", "per_call")))
    gaps = d.get("piecewise_launch_gaps", {})
    lines += ["Attention op host µs per call: " + ", ".join(f"{c} {h['median_us']:.1f} (IQR {h['iqr_us']:.1f})"
                                                           for c, h in host.items())
              + ". PIECEWISE's own host time (call span outside graph launches and attention calls, profiler "
              "included): " + ", ".join(f"{b}: {g['gaps_us']:.0f} µs of a {g['call_us']:.0f} µs call over "
                                        f"{g['launches']:.0f} launches, {g['gap_us_per_launch']:.1f} µs each"
                                        for b, g in gaps.items()) + ".", ""]
    not_served = {k.split("|")[0]: v["skip"] for k, v in entries.items() if "cannot serve" in v.get("skip", "")}
    lines += [f"Cannot serve here: {'; '.join(f'{i}: {why}' for i, why in not_served.items())}.", ""] * bool(not_served)
    lines += [which_mode(name, entries, traces), ""]
    plot = {i: (list(traces), [_spread(entries, i, base, t) for t in traces]) for i in impls if i != base}
    return Part(lines, plots=[(f"serving_{model}_{attention}.png",
                               f"{name}: tokens/s ÷ FULL_AND_PIECEWISE's", plot)])


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
        found = {i: e["tokens_per_s"] for k, e in entries.items() if k.endswith(f"|{trace} trace")
                 and "tokens_per_s" in e for i in [k.split("|")[0]]}
        if not found:
            continue
        best = max(found, key=found.get)
        modes = {i: found[i] / found[best] for i in PIECEWORKS_MODES if i in found}
        top = max(modes, key=modes.get) if modes else None
        said.append(f"on the {trace} trace {best} serves most tokens/s ({found[best]:,.0f})" + (
            f"; of pieceworks' modes {top.split('-', 1)[1].upper()} ({modes[top]:.1%} of it)" if top else "")
            + "".join(f", {i.split('-', 1)[1].upper()} {m:.1%}" for i, m in modes.items() if i != top))
    return f"Which mode ({name}): " + "; ".join(said) + "." if said else ""


def memory(r: Results) -> Part:
    """A memory table per `MEMORY_RUNS` model (1, 8 and 51 sizes; PIECEWISE, FULL and the peers), and the pool,
    estimate and capture targets judged on their "models", a capture miss explained by `capture_note`."""
    part, found = Part(), {k: [] for k in ("pool_51_vs_largest", "pool_estimate_error", "capture_51_s",
                                           "capture_51_vs_peer", "capture_ms_per_size")}
    for benchmark, (model, title) in MEMORY_RUNS.items():
        runs = {m: {n: {k: r.value(f"memory.{benchmark}.track_{k}", m, n) for k in MEMORY_COLUMNS} for n in (1, 8, 51)}
                for m in MEMORY_SUBJECTS}
        if all(runs[m][1]["pool_mib"] is None for m in ("PIECEWISE", "FULL")):
            continue
        part.lines += [f"### {title}, bfloat16", "", *_table(["mode", "sizes", *MEMORY_COLUMNS.values()], "lrrrrrrrrr", (
            [m, n, *(_fmt(x, 2 if k == "capture_seconds" else 1) for k, x in v.items())]
            for m, by_n in runs.items() for n, v in by_n.items() if v["pool_mib"] is not None))]
        peers = {m: runs[m][51]["capture_seconds"] for m in MEMORY_SUBJECTS[2:] if runs[m][51]["capture_seconds"]}
        for mode, s in ((m, runs[m]) for m in MEMORY_SUBJECTS[:2]):
            pool, seconds = s[1]["pool_mib"] and s[51]["pool_mib"] and s[51]["pool_mib"] / s[1]["pool_mib"], \
                s[51]["capture_seconds"]
            error = s[51]["pool_mib"] and s[51]["estimate_mib"] is not None and \
                abs(s[51]["estimate_mib"] - s[51]["pool_mib"]) / s[51]["pool_mib"]
            fastest = min(peers, key=peers.get) if peers else None
            vs_peer = seconds / peers[fastest] if seconds and fastest else None
            for key, x, text in [("pool_51_vs_largest", pool, f"{_fmt(pool, 3)}×"),
                                 ("pool_estimate_error", error if error is not False else None, (
                                     f"{_fmt(s[51]['estimate_mib'], 1)} vs {_fmt(s[51]['pool_mib'], 1)} MiB")),
                                 ("capture_51_s", seconds, f"{_fmt(seconds, 2)} s"),
                                 ("capture_51_vs_peer", vs_peer, f"{_fmt(vs_peer, 2)}× {fastest}"),
                                 ("capture_ms_per_size", seconds and 1e3 * seconds / 51, "")]:
                if model in r.targets[key]["models"] and x is not None:
                    note = "" if x <= r.limit(key) or key == "pool_estimate_error" else \
                        pool_note(f"{title} {mode}", s) if key == "pool_51_vs_largest" else capture_note(r, model, mode)
                    found[key].append((f"{title} {mode}: {text or f'{x:.1f} ms'}", x <= r.limit(key), note))
    if not part.lines:
        return not_measured("Memory and capture", r.skip_reason("memory"), targets=[r.label(key) for key in found])
    part.lines[:0] = ["## Memory and capture", "", "MiB; unshared: a pool per size.", ""]
    for key, rows in found.items():
        part.add(target_row(r.label(key), [row[:2] for row in rows], "", "; ".join(n for *_, n in rows if n)))
    return part


def pool_note(what: str, sizes: dict[int, dict]) -> str:
    """Where a pool grows as sizes are added, e.g. "Llama 1B PIECEWISE: pool 54.0 MiB for the largest size, 54.0
    for 8 sizes, 60.0 for 51 (a pool per size: 1534.0)": the smaller sizes' graphs keep memory the largest's
    did not hold."""
    pools = [_fmt(sizes[n]["pool_mib"]) for n in (1, 8, 51)]
    return (f"{what}: pool {pools[0]} MiB for the largest size, {pools[1]} for 8 sizes, {pools[2]} for 51 (a pool "
            f"per size: {_fmt(sizes[51]['unshared_pool_mib'])})")


def capture_note(r: Results, model: str, mode: str) -> str:
    """Where a capture's time goes: the first size (warm-up runs, first allocations) against each further graph,
    e.g. "toy_llama PIECEWISE: 663 graphs; 1 size (13 graphs) 0.27 s, then 1.37 ms a graph", and its cProfile."""
    details = r.details.get("memory" if model == "toy_llama" else f"memory_{model}", {})
    one, all_ = details.get("entries", {}).get(f"{mode}|1", {}), details.get("entries", {}).get(f"{mode}|51", {})
    if not all(isinstance(e.get(k), (int, float)) for e in (one, all_) for k in ("capture_seconds", "graphs")) \
            or all_["graphs"] <= one["graphs"]:
        return ""
    per_graph = (all_["capture_seconds"] - one["capture_seconds"]) / (all_["graphs"] - one["graphs"])
    profile = details.get("capture_profiles", {}).get(mode)
    where = f"; under cProfile ({profile['seconds']:.2f} s), own time: {_own_time(profile['top'], 'tottime_s', 's')}" \
        if profile else ""
    return (f"{details.get('model')} {mode}: {all_['graphs']} graphs; 1 size ({one['graphs']} graphs) "
            f"{one['capture_seconds']:.2f} s, then {1e3 * per_graph:.2f} ms a graph{where}")


STARTED_MODELS = {"compile": ("CompileStart", "ToyLlama 12 layers"),  # details: (asv class, model)
                  "compile_llama_1b": ("CompileStartLlama1B", "Llama-3.2-1B's shape (bfloat16)"),
                  "compile_user_model": ("CompileStartUserModel", "User's model")}


def compile_starts(r: Results) -> Part:
    """A start-up table per model (`STARTED_MODELS`), each start against the model's cold start; the warm-start
    target judged on every warm start, a miss's first call split into its parts (`first_call_note`)."""
    part = Part()
    for detail, (cls, model) in STARTED_MODELS.items():
        part.add(model_starts(r, detail, cls, model))
    return part


def model_starts(r: Results, detail: str, cls: str, model: str) -> Part:
    details, reason = r.details.get(detail, {}), r.skip_reason(detail, needs_cuda=detail == "compile_llama_1b")
    if detail == "compile_user_model":  # its name, when the run recorded it, and what it is
        model += (f" {details['model']}" if details.get("model") else "") + " (a Hugging Face config.json)"
    name, title = f"compile.{cls}.track_", f"Start-up: cold, warm, warm on a new host: {model}"
    starts = {s: {**details.get("entries", {}).get(s, {}), **{k: r.value(name + k, s) for k in (
        "first_call_seconds", "process_seconds", "inductor_compiles", "artifacts_loaded")}}
        for s in ("cold", "warm", "warm_new_host")}
    label = r.label("warm_vs_cold", device=f"; {model}" + (f" on {details['device']}" if details.get("device") else ""))
    cold = starts["cold"]["first_call_seconds"]
    if cold is None:
        return not_measured(title, reason, targets=[label])
    rows, measured, notes = [], [], []
    shown = {c: f for c, f in START_COLUMNS.items()  # a column the run did not record (capture on a CPU) is left out
             if f is None or any(entry.get(f) is not None for entry in starts.values())}
    for start, entry in starts.items():
        first, compiles, traces = (entry.get(k) for k in ("first_call_seconds", "inductor_compiles", "dynamo_traces"))
        ratio = first / cold if first is not None else None
        rows.append([start, *(_fmt(ratio if field is None else entry.get(field),
                                   0 if field and not field.endswith("seconds") else 2) for field in shown.values())])
        if start == "cold" or ratio is None:
            continue
        ok = compiles == 0 and traces in (0, None) and entry.get("kernel_rebuilds") in (0, None) and \
            ratio <= r.limit("warm_vs_cold")
        measured.append((f"{start}: {ratio:.2f}× cold, {_fmt(compiles, 0)} compiles, {_fmt(traces, 0)} traces", ok))
        notes += [] if ok else [first_call_note(start, entry)]
    floor, above = details.get("entries", {}).get("floor", {}).get("process_seconds"), []
    if floor is not None and starts["cold"].get("process_seconds") is not None:
        over = {s: e["process_seconds"] - floor for s, e in starts.items() if e.get("process_seconds") is not None}
        primed = details["entries"]["floor"].get("bytecode_primed")
        above = [f"Floor (a fresh process importing torch and pieceworks): {floor:.2f} s"
                 + (" (Python bytecode cached by a priming start: this installation's was not)" if primed else "")
                 + ". Process seconds above it: "
                 + ", ".join(f"{s} {x:.2f} s ({x / over['cold']:.2f}× cold's)" for s, x in over.items()) + ".", ""]
    return Part([f"## {title}", "", f"{model} on {details.get('device', '?')}. Trace: the first call "
                 "outside the backend (Dynamo's trace, or reading the serving record, and one run).", "",
                 *_table(["start", *shown], "l" + "r" * len(shown), rows), *above]).add(
        target_row(label, measured, reason, "; ".join(n for n in notes if n), "; "))


def first_call_note(what: str, entry: dict) -> str:
    """Where a start's first call went, e.g. "warm: 3.90 s = trace 1.20 + split 0.20 + load 2.10 + compile 0.00 s",
    the top of its cProfile where the run profiled it, and the first three lines pieceworks logged in it (why it
    traced, compiled or rebuilt kernels; each on one line, cut to 200 characters); "" where the run did not record the
    parts."""
    parts, profile = [entry.get(f"{k}_seconds") for k in FIRST_CALL_PARTS], entry.get("first_call_profile")
    if any(x is None for x in parts):
        return ""
    logged = [line if len(line) <= 200 else line[:199] + "…" for line in dict.fromkeys(
        " ".join(str(message).split()).replace("|", r"\|") for message in entry.get("log") or [])][:3]
    return f"{what}: {parts[0]:.2f} s = " + " + ".join(f"{k} {x:.2f}" for k, x in zip(FIRST_CALL_PARTS[1:], parts[1:])) \
        + " s" + (f"; under cProfile ({profile['seconds']:.2f} s), own time: "
                  f"{_own_time(profile['top'], 'tottime_s', 's')}" if profile else "") \
        + ("; pieceworks logged: " + " / ".join(f'"{line}"' for line in logged) if logged else "")


HOST_COLUMNS = {"device": "device", "mode": "mode", "batch": "batch", "pieces": "pieces", "forward µs": "forward_us",
                "compiled pieces alone (graph replays)": "compiled_pieces_alone_us",
                "splitting ops alone": "splitting_ops_alone_us", "overhead µs": "overhead_us",
                "per piece µs": "overhead_per_piece_us", "replay µs": "replay_run_us",
                "forward / replay": "call_over_replay", "wall µs": "wall_us"}  # {column: pytest-benchmark's field}


def host_overhead(r: Results) -> Part:
    """pytest-benchmark's table, its GPU rows judged (overhead per piece, the call over its replay); asv's CPU table."""
    bench, reason = r.pytest_benchmark, r.skip_reason("host_overhead")
    rows = sorted(({"batch": 4, **b["extra_info"], "wall_us": b["stats"]["median"] * 1e6}
                   for b in bench.get("benchmarks", []) if "mode" in b.get("extra_info", {})),
                  key=lambda x: (str(x["device"]), x["mode"], x["batch"]))
    part = Part(["## Host overhead of the runtime", ""])
    if rows:
        commit, digits = bench.get("pieceworks_commit"), {"overhead_per_piece_us": 2, "call_over_replay": 3}
        part.lines += [f"pytest-benchmark (`suites/test_host_overhead.py`), {bench.get('datetime', '?')[:19]} UTC"
                       f"{', commit ' + commit[:12] if commit else ''}.", "",
                       *_table(list(HOST_COLUMNS), "llrrrrrrrrrr", ([_fmt(x.get(k), digits.get(k, 1))
                                                                     for k in HOST_COLUMNS.values()] for x in rows))]
    else:
        part.add(not_measured("GPU (pytest-benchmark)", reason, heading=False))
    gpu, per_piece, call = [x for x in rows if x["device"] != "cpu"], "overhead_per_piece_us", "call_vs_replay"
    part.add(target_row(r.label(per_piece), [(f"b{x['batch']}: {x[per_piece]:.2f} µs", x[per_piece] <= r.limit(
        per_piece)) for x in sorted(gpu, key=lambda x: x["batch"]) if x["mode"] == "PIECEWISE"], reason))
    part.add(target_row(r.label(call), [(f"{x['mode']} b{x['batch']}: {x['call_over_replay']:.3f}×", x[
        "call_over_replay"] <= r.limit(call)) for x in gpu if x.get("call_over_replay") is not None], reason))
    name = "host_overhead.HostOverheadCPU.track_"
    cpu = {m: [r.value(name + k, m) for k in ("forward_us", "overhead_per_forward_us", "overhead_per_piece_us")]
           for m in ("tiny", "toy_llama")}
    if not any(v[0] is not None for v in cpu.values()):
        return part.add(not_measured("asv, CPU", r.skip_reason("host_overhead_cpu", needs_cuda=False), heading=False))
    return part.add(Part(["asv, CPU (mode NONE, host clock), µs:", "",
                          *_table(["model", "forward", "overhead per forward", "per piece"], "lrrr", (
                              [m, _fmt(f), _fmt(o), _fmt(p, 2)] for m, (f, o, p) in cpu.items()))]))


def side_by_side(r: Results) -> Part:
    """The newest runtime breakdown (`python -m pieceworks.harness.breakdown`): a table per dtype of each variant's
    median µs and each ratio it timed (the median of its per-round ratios, with their range), and the call-over-plan
    target row, a miss explained by `call_profile_note`; its PIECEWISE / pcg and FULL ratios are table cells only."""
    doc, title, key = r.details.get("runtime_breakdown"), "Side by side, in rotating rounds", "call_vs_replay"
    if not doc:
        return not_measured(title, r.skip_reason("runtime_breakdown"))
    results, found = doc.get("dtypes") or {}, []
    part = Part([f"## {title}", "", f"`python -m pieceworks.harness.breakdown`, commit {doc['commit']}, "
                 f"{doc.get('date', '?')} ({doc.get('device', '?')}, torch {doc.get('torch', '?')}): median µs.", ""])
    for dtype, result in results.items():
        if not (rows := result.get("batches")):
            part.add(not_measured(dtype, str(result.get("crashed") or result.get("errors")), False))
            continue
        shown = list(dict.fromkeys(v for row in rows.values() for v in row["us"]))
        ratios = list(dict.fromkeys(n for row in rows.values() for n, x in row.get("ratios", {}).items() if x))
        cells = ([b, *(_fmt(row["us"].get(v, {}).get("median_us")) for v in shown),
                  *(_ratio((row["ratios"].get(n) or {}).get("median"), row["ratios"].get(n), 3) for n in ratios)]
                 for b, row in rows.items())
        part.lines += [f"### {dtype}", "", *_table(["batch", *shown, *ratios], "r" * (1 + len(shown) + len(ratios)),
                                                   cells)]
        found += [(dtype, b, x["median"], x) for b, row in rows.items()
                  if (x := row.get("ratios", {}).get(r.targets[key]["ratio"]))]
    return part.add(ratio_row(r, key, found, "", lambda d, _: call_profile_note(d, results[d]), "rounds_label")
                    if found else Part())


def call_profile_note(dtype: str, result: dict) -> str:
    """"<dtype> b1 under cProfile (100 calls each ...): call 61 ms vs plan 48 ms, own time the call adds per forward:
    ..." from the `call_profile` of one dtype of a runtime breakdown; "" where it recorded none."""
    if not (found := result.get("call_profile") or {}).get("added"):
        return ""
    call, plan = (1e3 * found["seconds"][side] for side in ("compiled call", "plan run"))
    return (f"{dtype} b{found['batch']} under cProfile ({found['calls']} calls each, profiler overhead included): "
            f"call {call:.0f} ms vs plan {plan:.0f} ms, own time the call adds per forward: "
            + _own_time(found["added"], "us_per_call", "µs", "calls_per_call"))


def dispatch(r: Results) -> Part:
    rows = sorted((n.split(".")[-1], _fmt(v.get(()) and v.get(()) * 1e6)) for n, v in r.asv.items()
                  if n.startswith("dispatch."))
    if not rows:
        return not_measured("Dispatch (CPU)", r.skip_reason("dispatch", needs_cuda=False))
    return Part(["## Dispatch (CPU, per sweep of 600 batch sizes)", "", *_table(["benchmark", "µs"], "lr", rows)])


def code_size(r: Results) -> Part:
    """The project's own check of the reference core's size (within or over, never met or missed), from asv's run."""
    name = "code_size.ReferenceCore.track_lines"
    lines, code, label = r.value(name, "lines"), r.value(name, "code"), r.label("core_lines")
    if code is None:
        return Part(own_checks=[(label, r.skip_reason("code_size", needs_cuda=False), "not measured", "")])
    files = sum(k != "total" for k in r.details.get("code_size", {}).get("files", {})) or "?"
    return Part(own_checks=[(label, f"{code:,.0f} code lines, {lines:,.0f} in all, {files} files",
                             "within" if code <= r.limit("core_lines") else "over", "")])


SECTIONS = (serving, latency, memory, compile_starts, host_overhead, side_by_side, dispatch, code_size)


def host_line(host: dict) -> str:
    """"- host: 16 of 64 logical CPUs usable (CPU model), load average 3.1 at the start, 1 GPU visible": what
    host-bound times (eager steps, host µs) depend on."""
    return (f"- host: {host.get('cpus_usable')} of {host.get('cpus')} logical CPUs usable ({host.get('cpu_model')}), "
            f"load average {host.get('load_average')} at the start, {host.get('gpus_visible')} GPU"
            f"{'' if host.get('gpus_visible') == 1 else 's'} visible")


def render(r: Results, machine: str, source: str) -> tuple[str, Part]:
    """The whole report, and what its sections add up to; `source` names where its result files come from
    (`result_files_source`)."""
    body, env = Part(), r.environment
    for section in SECTIONS:
        body.add(section(r))
    text = [f"# Benchmark report: {machine}", "",
            f"Generated by `python -m pieceworks.harness.report` from {source}; no number is edited by hand. How each "
            f"number was measured: [docs/benchmarks.md]({DOCS}).", "",
            f"- device: {env.get('device', '?')} (driver {env.get('driver')}, CUDA {env.get('cuda')})",
            f"- torch {env.get('torch')}, Triton {env.get('triton')}, Python {env.get('python')}",
            *([host_line(env["host"])] if env.get("host") else []),
            f"- run: {env.get('date', '?')}, asv machine `{machine}`, commit {r.commit[:12]}: every number below comes "
            f"from it" + (f" ({r.others} result files of other commits, or recording none, are left out)" if r.others else ""),
            "",
            "## Targets (ratios from one run; reported, never asserted)", "",
            *_table(["target", "measured", "verdict", "where the time goes (misses)"], "llll", body.targets),
            *body.lines, "## The project's own checks (goals for its code, not product targets)", "",
            *_table(["check", "measured", "verdict", "note"], "llll", body.own_checks)]
    if body.plots:
        text += ["## Plots", "", *(f"![{p[0]}](plots/{p[0]})" for p in body.plots), ""]
    return "\n".join(text), body


def write_plots(plots: list[tuple[str, str, dict]], folder: str) -> list[str]:
    """Each latency plot (see `Part`) as `folder`/<file name>, µs against batch size on log axes, a line per
    implementation; none without matplotlib. Returns the paths written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    os.makedirs(folder, exist_ok=True)
    for filename, title, series in plots:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        if series and isinstance(next(iter(series.values()))[0][0], str):  # ratios by trace, with their range
            width = 0.8 / len(series)
            for k, (label, (names, found)) in enumerate(series.items()):
                xs = [j + k * width for j, f in enumerate(found) if f]
                mid, lo, hi = (zip(*[f for f in found if f]) if any(found) else ((), (), ()))
                ax.bar(xs, mid, width, label=label, yerr=[[m - a for m, a in zip(mid, lo)],
                                                          [b - m for m, b in zip(mid, hi)]], capsize=2)
            ax.axhline(1.0, color="k", linewidth=0.8)
            ax.set(title=title, ylabel="ratio (1 = FULL_AND_PIECEWISE)")
            ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names)
            ax.legend(fontsize=7)
            fig.tight_layout()
            fig.savefig(os.path.join(folder, filename), dpi=110)
            plt.close(fig)
            continue
        for label, (xs, ys) in series.items():
            ax.plot(xs, [math.nan if y is None else y for y in ys], marker="o", label=label)
        ax.set(title=title, xlabel="batch size", ylabel="µs per forward (median)", xscale="log", yscale="log")
        ax.set_xticks(xs, [str(x) for x in xs])
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(os.path.join(folder, filename), dpi=110)
        plt.close(fig)
    return [os.path.join(folder, p[0]) for p in plots]


def result_files_source(paths: list[str], results: str) -> str:
    """"the committed result files" where git tracks every one of `paths` unmodified, else "the result files in
    `<results>`" (also where git is missing or `results` lies outside a repository)."""
    try:
        status = subprocess.run(["git", "-C", results, "status", "--porcelain", "--ignored", "--untracked-files=all",
                                 "--", *map(os.path.abspath, paths)], capture_output=True, text=True, timeout=60)
        committed = status.returncode == 0 and not status.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        committed = False
    return "the committed result files" if committed else f"the result files in `{results}`"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results", help="the results folder (asv/ and bench/ inside)")
    parser.add_argument("--machine", required=True, help="asv machine name (a folder of results/asv/)")
    parser.add_argument("--commit", default=None, help="the commit whose results to report (default: the newest)")
    parser.add_argument("--no-plots", action="store_true", help="REPORT.md only (its plot links stay as they are)")
    args = parser.parse_args(argv)
    try:
        results = load_results(args.results, args.machine, args.commit)
    except ResultSetError as exc:
        print(f"report: {exc}: run the benchmarks first", file=sys.stderr)
        return 1
    text, body = render(results, args.machine, result_files_source(results.files, args.results))
    os.makedirs(bench := os.path.join(args.results, "bench", args.machine), exist_ok=True)
    plots = [] if args.no_plots else write_plots(body.plots, os.path.join(bench, "plots"))
    with open(os.path.join(bench, "REPORT.md"), "w") as f:
        f.write(text)
    print(f"report: wrote {os.path.join(bench, 'REPORT.md')} and {len(plots)} plots")
    return 0


if __name__ == "__main__":
    sys.exit(main())
