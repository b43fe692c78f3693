"""The benchmark report: tables, target verdicts and PNG plots, regenerated from result files.

`python -m pieceworks.harness.report --machine NAME` reads asv's results of that machine (each benchmark from the
newest run that has it, or `--commit`'s run only) and the files beside them in `results/bench/NAME/`, and writes
`REPORT.md` and `plots/*.png` there (matplotlib; without it, the tables only). Targets: the "targets" and
"own_checks" tables of ci/thresholds.json. Nothing is measured here: every ratio comes from numbers of one run, a
section without numbers says "not measured here" and why, and the header says "committed" only of result files git
tracks unmodified. docs/benchmarks.md says how each number was measured.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import glob
import json
import math
import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from typing import Any

from pieceworks.gate.results import ResultSetError, is_number, newest_runs, result_files, values_of
from pieceworks.gate.thresholds import DEFAULT_PATH

__all__ = ["Part", "Results", "SIDE_BY_SIDE", "load_results", "main", "render", "result_files_source"]

LIBRARY_DOMINATES = 0.5  # a library kernel family above this share of GPU time dominates the batch size
LATENCY_TABLES = [("toy_llama", "bfloat16"), ("toy_llama", "float32"), ("silly", "bfloat16"), ("silly", "float32")]
LATENCY_TARGETS = ("piecewise_vs_pcg", "full_vs_reduce_overhead")  # the ratios each latency table shows
SIDE_BY_SIDE = ["compiled call", "plan run", "graph replays", "splitting ops", "FULL", "FULL unsplit", "meta-pcg",
                "reduce-overhead"]  # the variants of a runtime_breakdown run, in the order its tables show them
UNSPLIT = "FULL unsplit / reduce-overhead"  # FULL with splitting_ops=[]: shown next to FULL, not a target
ROUND_RATIOS = ("piecewise_vs_pcg", "full_vs_reduce_overhead", None, "call_vs_replay")  # None: UNSPLIT
START_COLUMNS = ["first call s", "vs cold", "in the backend s", "compile or load s", "outside s", "process s",
                 "Inductor compiles", "artifacts loaded"]


@dataclasses.dataclass
class Results:
    """One machine's result files, read once (`load_results`)."""

    asv: dict[str, dict[tuple, Any]]  # {benchmark: {params: value, None where skipped or failed}}
    commits: dict[str, str]  # {benchmark: the commit of the run its values come from}
    cpu: str  # asv's machine parameter of the newest run
    details: dict[str, Any]  # results/bench/<machine>/<name>.json by name, host_overhead.json apart
    pytest_benchmark: dict  # host_overhead.json, {} where absent
    files: list[str]  # every file read
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
        return "not run on this machine"


def load_results(results: str, machine: str, commit: str | None = None, targets: str = DEFAULT_PATH) -> Results:
    """`results`/asv/`machine` (of `commit` only, if given), `results`/bench/`machine`, and the targets of the
    thresholds file `targets`; raises ResultSetError where asv has no results."""
    files = result_files(os.path.join(results, "asv", machine), commit)
    runs = newest_runs(files)
    asv = {name: {tuple(map(ast.literal_eval, combo)): v if is_number(v) else None
                  for combo, v, _ in values_of(path, doc, name)} for name, (_, path, doc) in runs.items()}
    newest = max(runs.values(), key=lambda run: run[0])[2] if runs else {}
    bench = sorted(glob.glob(os.path.join(results, "bench", machine, "*.json")))
    details = {}
    for path in bench:
        with open(path) as f:
            details[os.path.splitext(os.path.basename(path))[0]] = json.load(f)
    pytest_benchmark = details.pop("host_overhead", {})
    with open(targets, encoding="utf-8") as f:
        table = json.load(f)
    environment = details.get("environment") or next((d for d in details.values() if "environment" in d), {})
    return Results(asv, {name: doc["commit_hash"] for name, (_, _, doc) in runs.items()},
                   (newest.get("params") or {}).get("cpu", "?"), details, pytest_benchmark, files + bench,
                   {**table["targets"], **table["own_checks"]}, environment.get("environment", {}))


@dataclasses.dataclass
class Part:
    """What one section adds: Markdown lines, target and own-check rows (what, measured, verdict, note), the
    sections it could not measure ("title (reason)"), and plots (file name, a function drawing on an Axes)."""

    lines: list[str] = dataclasses.field(default_factory=list)
    targets: list[tuple[str, str, str, str]] = dataclasses.field(default_factory=list)
    own_checks: list[tuple[str, str, str, str]] = dataclasses.field(default_factory=list)
    unmeasured: list[str] = dataclasses.field(default_factory=list)
    plots: list[tuple[str, Callable[[Any], None]]] = dataclasses.field(default_factory=list)

    def add(self, other: Part) -> Part:
        for field in dataclasses.fields(self):
            getattr(self, field.name).extend(getattr(other, field.name))
        return self


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _range(spread: dict | None, digits: int = 2) -> str:
    return f" ({spread['min']:.{digits}f}-{spread['max']:.{digits}f})" if spread else ""


def _verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else ("met" if ok else "**missed**")


def _row(cells: Iterable[Any]) -> str:
    return "| " + " | ".join(map(str, cells)) + " |"


def _table(columns: list[str], align: str, rows: Iterable[Iterable[Any]]) -> list[str]:
    """A Markdown table, column i aligned left or right as `align`[i] is "l" or "r", and a blank line."""
    return [_row(columns), "|" + "".join("---:|" if a == "r" else "---|" for a in align), *map(_row, rows), ""]


def not_measured(title: str, reason: str) -> Part:
    """A section with no numbers: its title and why, never a method text over no table."""
    return Part([f"## {title}", "", f"Not measured here ({reason}).", ""], unmeasured=[f"{title} ({reason})"])


def target_row(label: str, measured: list[tuple[str, bool]], reason: str, note: str = "", sep: str = ", ") -> Part:
    """A target's row: each measured value's text, met where every one is within the target; "not measured" and
    `reason` where nothing was measured."""
    if not measured:
        return Part(targets=[(label, reason, _verdict(None), "")])
    return Part(targets=[(label, sep.join(text for text, _ in measured), _verdict(all(ok for _, ok in measured)),
                          note)])


# ---- latency ------------------------------------------------------------------------------------------------------
def latency(r: Results) -> Part:
    worst: dict[str, list] = {key: [] for key in LATENCY_TARGETS}  # (ratio, dtype, batch, per-round spread)
    tables = [latency_table(r, model, dtype, worst) for model, dtype in LATENCY_TABLES]
    reason = r.skip_reason("latency_toy_llama_bfloat16")
    if not any(t.lines for t in tables):
        part = not_measured("Latency", reason)
    else:
        part = Part(["## Latency", "", "Median µs per forward (CUDA events, 200 samples after 20 warm-up calls), IQR "
                     "in brackets; every number of a table comes from one process. Ratios: PIECEWISE / Meta pcg and "
                     "FULL / reduce-overhead, from the same table. Where the run timed implementations side by side in "
                     "rotating rounds (listed under the table), a ratio is the median of its per-round ratios, "
                     "(min-max) over the rounds; in older runs, each implementation was timed in turn and a ratio is "
                     "one median over the other.", ""])
        for (model, dtype), table in zip(LATENCY_TABLES, tables):
            part.add(table if table.lines else Part(
                [f"{model} {dtype}: not measured here ({r.skip_reason(f'latency_{model}_{dtype}')})", ""]))
    for key, found in worst.items():
        ratios = [(x, d, b, s) for x, d, b, s in found if x is not None]
        misses = sorted(((x, d, b) for x, d, b, _ in ratios if x > r.limit(key)), reverse=True)[:3]
        note = "; ".join(profile_note(r, d, b, tuple(r.targets[key]["sides"])) for _, d, b in misses)
        part.add(target_row(r.label(key), [(f"{d} b{b}: {x:.2f}×{_range(s)}", x <= r.limit(key))
                                           for x, d, b, s in ratios], reason, note))
    return part.add(kernel_profiles(r))


def latency_table(r: Results, model: str, dtype: str, worst: dict[str, list]) -> Part:
    """The table of one latency class (an empty Part where nothing was measured); adds ToyLlama's ratios to `worst`."""
    name = f"latency.{ {'toy_llama': 'ToyLlama', 'silly': 'Silly'}[model]}{dtype.capitalize()}"
    found, iqr = r.asv.get(f"{name}.track_median_us", {}), r.asv.get(f"{name}.track_iqr_us", {})
    details = r.details.get(f"latency_{model}_{dtype}", {})
    batches = sorted({k[1] for k in found})
    present = [i for i in dict.fromkeys(k[0] for k in found) if any(found.get((i, b)) is not None for b in batches)]
    if not present:
        return Part()
    rows = []
    for b in batches:
        rows.append([b, *("n/a" if found.get((i, b)) is None else f"{found[i, b]:.0f} ({_fmt(iqr.get((i, b)), 0)})"
                          for i in present)])
        for key in LATENCY_TARGETS:
            in_rounds = details.get("ratios", {}).get(str(b), {}).get(r.targets[key]["ratio"])
            ratio, spread = latency_ratio(in_rounds, *(found.get((i, b)) for i in r.targets[key]["sides"]))
            rows[-1].append(f"{_fmt(ratio, 2)}×{_range(spread)}")
            if model == "toy_llama":
                worst[key].append((ratio, dtype, b, spread))
    lines = [f"### {model}, {dtype}", "", *_table(["batch", *present, "PIECEWISE / pcg", "FULL / reduce-overhead"],
                                                   "r" * (len(present) + 3), rows)]
    if details.get("side_by_side"):
        lines[-1:] = ["", f"Timed side by side in {details.get('rounds')} rotating rounds: "
                      f"{', '.join(details['side_by_side'])}; the others each alone, before them.", ""]

    def plot(ax: Any) -> None:
        for impl in present:
            ax.plot(batches, [found.get((impl, b)) or math.nan for b in batches], marker="o", label=impl)
        ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="µs per forward (median)",
               title=f"{model}, {dtype}: latency vs batch")
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.legend(fontsize=7)
    return Part(lines, plots=[(f"latency_{model}_{dtype}.png", plot)])


def latency_ratio(in_rounds: dict | None, top: float | None, bottom: float | None) -> tuple[float | None, Any]:
    """(ratio, its per-round spread or None): the median of the per-round ratios where the run timed both sides in
    rotating rounds, else (older runs, each timed in turn) one median over the other."""
    if in_rounds:
        return in_rounds["median"], in_rounds
    return (top / bottom if top and bottom else None), None


def _both_sides(impls: tuple[str, str], medians: list[float | None], profiles: list[dict]) -> str:
    """"A 255 µs, kernels 225 µs (88% busy) vs B ...; kernels only in A: ..." for the two sides of a ratio."""
    from pieceworks.harness.profile import kernels_only_in

    only = ", ".join(f"`{name[:48]}` {us:.1f} µs in {calls:.0f} launches"
                     for name, us, calls in kernels_only_in(*profiles))
    return " vs ".join(f"{i} {_fmt(m, 0)} µs, kernels {p['device_us_per_call']:.0f} µs ("
                       f"{_fmt(m and 100 * p['device_us_per_call'] / m, 0)}% busy)" for i, m, p in
                       zip(impls, medians, profiles)) + (f"; kernels only in {impls[0]}: {only}" if only else "")


def profile_files(r: Results) -> list[dict]:
    return [d for name, d in sorted(r.details.items()) if name.startswith("profile_") and "profiles" in d]


def side_by_side_profile(r: Results, dtype: str, batch: int, impls: tuple[str, str]) -> str | None:
    """Both sides of a ratio from the first side-by-side profile file with both (same dtype and batch), or None."""
    keys = [f"{i}|{batch}" for i in impls]
    for doc in profile_files(r):
        if doc.get("dtype") == dtype and all(k in doc["profiles"] for k in keys):
            return f"{dtype} b{batch} (side-by-side profile): " + _both_sides(
                impls, [doc["timings"][k]["median_us"] for k in keys], [doc["profiles"][k] for k in keys])
    return None


def profile_note(r: Results, dtype: str, batch: int, impls: tuple[str, str]) -> str:
    """Where a missed ratio's time goes: both sides from the latency run's profiles, else from a side-by-side
    profile, else from the first of the two sides (or eager) that the latency run profiled."""
    run = r.details.get(f"latency_toy_llama_{dtype}", {})
    profiles, entries = run.get("profiles", {}), run.get("entries", {})
    keys = [f"{i}|{batch}" for i in impls]
    if all(k in profiles for k in keys):
        return f"{dtype} b{batch}: " + _both_sides(impls, [entries.get(k, {}).get("median_us") for k in keys],
                                                   [profiles[k] for k in keys])
    found = side_by_side_profile(r, dtype, batch, impls)
    if found is not None:
        return found
    for impl in (*impls, "eager"):
        prof, med = profiles.get(f"{impl}|{batch}"), entries.get(f"{impl}|{batch}", {}).get("median_us")
        if prof and prof.get("top"):
            top, busy = prof["top"][0], prof["device_us_per_call"] / med if med else None
            return (f"{dtype} b{batch}: {impl}: kernels {prof['device_us_per_call']:.0f} µs of {_fmt(med, 0)} µs (GPU "
                    f"busy {_fmt(busy and 100 * busy, 0)}%), top {top['kind']} kernel {top['us_per_call']:.0f} "
                    f"µs/forward ({100 * top['share']:.0f}%)")
    return f"{dtype} b{batch}: no profile recorded"


def kernel_profiles(r: Results) -> Part:
    """The latency runs' kernel profiles (ToyLlama) and the side-by-side profile files, a table each."""
    rows, side = [], []
    for dtype in ("bfloat16", "float32"):
        profiles = r.details.get(f"latency_toy_llama_{dtype}", {}).get("profiles", {})
        for key, prof in sorted(profiles.items(), key=lambda kv: (kv[0].split("|")[0], int(kv[0].split("|")[1]))):
            if prof.get("top"):
                top, share = prof["top"][0], prof["library_share"]
                rows.append([dtype, *key.split("|"), f"{prof['device_us_per_call']:.0f}", f"{100 * share:.0f}%" + (
                    " (library dominates)" if share >= LIBRARY_DOMINATES else ""), f"`{top['name'][:70]}` "
                    f"{top['us_per_call'] / max(top['calls_per_call'], 1):.1f} µs × {top['calls_per_call']:.0f}"])
    for doc in profile_files(r):
        for key, prof in doc["profiles"].items():
            med, kernel_us = doc["timings"][key]["median_us"], prof["device_us_per_call"]
            side.append([doc["dtype"], *key.split("|"), f"{med:.1f}", f"{kernel_us:.0f}",
                         f"{100 * kernel_us / med:.0f}%", "; ".join(
                             f"`{k['name'][:48]}` {k['us_per_call']:.1f} µs × {k['calls_per_call']:.0f}"
                             for k in prof["top"][:4])])
    part = Part()
    if rows:
        part.lines += ["### Kernel profiles (torch.profiler, once per size; ToyLlama)", "",
                       "GPU kernel µs per forward, the share of library GEMM/GEMV kernels (cuBLAS, cuBLASLt, CUTLASS; "
                       f"≥ {100 * LIBRARY_DOMINATES:.0f}% = the library, not the implementation, dominates that size), "
                       "and the top kernel (µs per call × calls per forward).", "",
                       *_table(["dtype", "implementation", "batch", "kernel µs", "library share", "top kernel"],
                               "llrrrl", rows)]
    if side:
        runs = "; ".join(f"{d.get('device')}, torch {d.get('torch')}, {d.get('date') or 'date: see results/README.md'}"
                         f"{', commit ' + d['commit'][:12] if d.get('commit') else ''}" for d in profile_files(r))
        part.lines += ["### Side-by-side profiles (`python -m pieceworks.harness.profile`; ToyLlama 12 layers)", "",
                       "Both sides of a target ratio built, timed (CUDA events, median of 200) and then profiled in "
                       "one process; kernel µs = GPU kernel time per forward (graph replays included); busy = kernel "
                       f"time / median. The top kernels: µs per forward × launches per forward. Runs: {runs}.", "",
                       *_table(["dtype", "implementation", "batch", "median µs", "kernel µs", "busy", "top kernels"],
                               "llrrrrl", side)]
    return part


# ---- memory and capture -------------------------------------------------------------------------------------------
MEMORY_COLUMNS = {"pool_mib": "pool", "reserved_delta_mib": "reserved Δ", "nvml_used_delta_mib": "NVML used Δ",
                  "unshared_pool_mib": "unshared pool", "unshared_reserved_delta_mib": "unshared reserved Δ",
                  "unshared_nvml_used_delta_mib": "unshared NVML Δ", "capture_seconds": "capture s"}


def memory(r: Results) -> Part:
    name, pool, capture = "memory.CaptureMemory.track_", "pool_51_vs_largest", "capture_51_s"
    if r.value(name + "pool_mib", "PIECEWISE", 1) is None and r.value(name + "pool_mib", "FULL", 1) is None:
        reason = r.skip_reason("memory")
        return not_measured("Memory and capture", reason).add(target_row(r.label(pool), [], reason)).add(
            target_row(r.label(capture), [], reason))
    series = {mode: {n: {k: r.value(name + k, mode, n) for k in MEMORY_COLUMNS} for n in (1, 8, 51)}
              for mode in ("PIECEWISE", "FULL")}
    part = Part(["## Memory and capture (ToyLlama 12 layers, bfloat16)", "",
                 "n sizes = the largest n of vLLM's 51 capture sizes (n = 1: 512 alone). One pool: one model capturing "
                 "all n. Unshared: one model per size, each its own pool, all alive. MiB.",
                 f"NVML: {r.details.get('memory', {}).get('nvml', '')}", "",
                 *_table(["mode", "sizes", *MEMORY_COLUMNS.values()], "lrrrrrrrr", (
                     [mode, n, *(_fmt(x, 2 if k == "capture_seconds" else 1) for k, x in v.items())]
                     for mode, by_n in series.items() for n, v in by_n.items()))])
    pools = {m: s[51]["pool_mib"] / s[1]["pool_mib"] if s[51]["pool_mib"] and s[1]["pool_mib"] else None
             for m, s in series.items()}
    part.add(target_row(r.label(pool), [(f"{m}: {_fmt(x, 3)}×", x is not None and x <= r.limit(pool))
                                        for m, x in pools.items()], ""))
    captures = {m: s[51]["capture_seconds"] for m, s in series.items()}
    misses = [m for m, c in captures.items() if c is not None and c > r.limit(capture)]
    part.add(target_row(r.label(capture), [(f"{m}: {_fmt(c, 2)} s", c is not None and c <= r.limit(capture))
                                           for m, c in captures.items()], "",
                        "; ".join(filter(None, (capture_note(r, m) for m in misses)))))

    def plot(ax: Any) -> None:
        for mode, by_n in series.items():
            for key, marker, style, how in (("pool_mib", "o", "-", "one pool"),
                                            ("unshared_pool_mib", "x", "--", "a pool per size")):
                ax.plot(list(by_n), [by_n[n][key] or math.nan for n in by_n], marker=marker, linestyle=style,
                        label=f"{mode}, {how}")
        ax.set(xlabel="captured sizes", ylabel="graph pool MiB", title="Graph pool vs captured sizes")
        ax.set_xticks([1, 8, 51])
        ax.legend(fontsize=8)
    part.plots.append(("pool_vs_sizes.png", plot))
    return part


def capture_note(r: Results, mode: str) -> str:
    """Where a capture's time goes: the first size (warm-up runs, first allocations) against each further graph,
    e.g. "PIECEWISE: 663 graphs; 1 size (13 graphs) 0.27 s, then 1.37 ms a graph", and its cProfile if recorded."""
    entries = r.details.get("memory", {}).get("entries", {})
    one, all_ = entries.get(f"{mode}|1", {}), entries.get(f"{mode}|51", {})
    if not all(isinstance(e.get(k), (int, float)) for e in (one, all_) for k in ("capture_seconds", "graphs")) \
            or all_["graphs"] <= one["graphs"]:
        return ""
    per_graph = (all_["capture_seconds"] - one["capture_seconds"]) / (all_["graphs"] - one["graphs"])
    profile = r.details.get("memory", {}).get("capture_profiles", {}).get(mode)
    where = "" if not profile else f"; under cProfile ({profile['seconds']:.2f} s), own time: " + ", ".join(
        f"`{p['function']}` {p['tottime_s']:.2f} s in {p['calls']} calls" for p in profile["top"][:5])
    return (f"{mode}: {all_['graphs']} graphs; 1 size ({one['graphs']} graphs) {one['capture_seconds']:.2f} s, then "
            f"{1e3 * per_graph:.2f} ms a graph{where}")


# ---- compile ------------------------------------------------------------------------------------------------------
def compile_starts(r: Results) -> Part:
    name, starts = "compile.CompileStart.track_", ("cold", "warm", "warm_new_host")
    rows = {s: {k: r.value(name + k, s) for k in ("first_call_seconds", "process_seconds", "inductor_compiles",
                                                     "artifacts_loaded")} for s in starts}
    device, entries = r.details.get("compile", {}).get("device", "?"), r.details.get("compile", {}).get("entries", {})
    later, measured, notes = warm_start_runs(r)
    part, cold = Part(["## Compile: cold, warm, warm on a new host", "", *later]), rows["cold"]["first_call_seconds"]
    if cold is None:
        reason = r.skip_reason("compile", needs_cuda=False)
        part.add(Part([f"asv: not measured here ({reason}).", ""], unmeasured=[f"Compile ({reason})"]))
        return part.add(target_row(r.label("warm_vs_cold", device=""), measured, reason, "; ".join(notes), "; "))
    part.lines += [f"ToyLlama 12 layers on {device}, each start a fresh process; first call = trace + compile or load. "
                   "Of the first call: in the backend = the pieceworks backend (split, cache key, compile or load), of "
                   "which compile or load = the pieces; outside = Dynamo's trace, its guards and one run of the model "
                   "(n/a: a run before this breakdown was recorded).", "",
                   *_table(["start", *START_COLUMNS], "lrrrrrrrr",
                           ([s, *start_cells({**entries.get(s, {}), **rows[s]}, cold)] for s in starts))]
    asv_measured, asv_notes = [], []
    for s in ("warm", "warm_new_host"):
        first, compiles = rows[s]["first_call_seconds"], rows[s]["inductor_compiles"]
        ratio = first / cold if first is not None else None
        asv_measured.append((f"{s}: {_fmt(ratio, 2)}× cold, {_fmt(compiles, 0)} compiles",
                             compiles == 0 and ratio is not None and ratio <= r.limit("warm_vs_cold")))
        note = first_call_note(s, entries.get(s, {}), first, " (Dynamo's trace, guards, one run)")
        if not asv_measured[-1][1] and note:
            asv_notes.append(note)
    part.add(target_row(r.label("warm_vs_cold", device=f"; {device}"), asv_measured + measured, "",
                        "; ".join(asv_notes + notes), "; "))

    def plot(ax: Any) -> None:
        ax.bar(starts, [rows[s]["first_call_seconds"] or 0 for s in starts])
        for i, s in enumerate(starts):
            ax.annotate(f"{_fmt(rows[s]['inductor_compiles'], 0)} compiles", (i, rows[s]["first_call_seconds"] or 0),
                        ha="center", va="bottom")
        ax.set(ylabel="first call s", title="Compile: cold / warm / warm on a new host")
    part.plots.append(("compile_starts.png", plot))
    return part


def warm_start_runs(r: Results) -> tuple[list[str], list[tuple[str, bool]], list[str]]:
    """The `warm_start_<label>.json` runs (`python -m pieceworks.harness.warm_start`): their table (placed before the
    asv one), what each warm start measured with whether it met the target, and where each warm first call went."""
    runs = sorted(((name[len("warm_start_"):], doc) for name, doc in r.details.items()
                   if name.startswith("warm_start_")), key=lambda item: (item[1].get("date", ""), item[0]))
    if not runs:
        return [], [], []
    rows, measured, notes = [], [], []
    for label, doc in runs:
        starts = doc.get("starts") or {}
        cold = (starts.get("cold") or {}).get("first_call_seconds")
        for start, entry in starts.items():
            first = entry.get("first_call_seconds")
            rows.append([label, start, *start_cells(entry, cold)])
            if start != "cold" and first is not None and cold:
                measured.append((f"{label} {start}: {first / cold:.2f}×", entry.get("inductor_compiles") == 0
                                 and first / cold <= r.limit("warm_vs_cold")))
                note = first_call_note(f"{label} {start}", entry, first)
                if start == "warm" and note:
                    notes.append(note)
    return ["Runs of `python -m pieceworks.harness.warm_start` (ToyLlama 12 layers, each start a fresh process; label "
            "= commit, and what else differed); first call = trace + compile or load + one run, of it: in the backend "
            "(of which compile or load) and outside (Dynamo's trace, its guards, one run). These runs are later than "
            "the asv run below.", "",
            *_table(["run", "start", *START_COLUMNS], "llrrrrrrrr", rows)], measured, notes


def start_cells(entry: dict, cold: float | None) -> list[str]:
    """The START_COLUMNS cells of a compile benchmark entry or a warm_start start."""
    first = entry.get("first_call_seconds")
    ratio = first / cold if first is not None and cold else None
    return [*(_fmt(x, 2) for x in (first, ratio, *first_call_parts(entry, first))), _fmt(entry.get("process_seconds")),
            _fmt(entry.get("inductor_compiles"), 0), _fmt(entry.get("artifacts_loaded"), 0)]


def first_call_note(label: str, entry: dict, first: float | None, outside_is: str = "") -> str:
    """"label: F s = O s outside the backend + B s in it, L s of which loading the pieces", or "" where the run
    recorded no breakdown."""
    backend, pieces, outside = first_call_parts(entry, first)
    if backend is None:
        return ""
    return (f"{label}: {_fmt(first, 2)} s = {_fmt(outside, 2)} s outside the backend{outside_is} + {_fmt(backend, 2)} "
            f"s in it, {_fmt(pieces, 2)} s of which loading the pieces")


def first_call_parts(entry: dict, first_call: float | None) -> tuple[float | None, float | None, float | None]:
    """(seconds in the backend, of which compiling or loading the pieces, seconds outside the backend) of a start's
    first call; Nones where the run did not record them."""
    backend, pieces = entry.get("backend_seconds"), entry.get("compile_or_load_seconds")
    return backend, pieces, first_call - backend if backend is not None and first_call is not None else None


# ---- host overhead ------------------------------------------------------------------------------------------------
HOST_COLUMNS = ["device", "mode", "batch", "pieces", "forward µs", "compiled pieces alone (graph replays)",
                "splitting ops alone", "overhead µs", "per piece µs", "replay µs", "forward / replay", "wall µs"]


def host_overhead(r: Results) -> Part:
    bench, reason = r.pytest_benchmark, r.skip_reason("host_overhead")
    rows = sorted((b["extra_info"] | {"wall_us": b["stats"]["median"] * 1e6} for b in bench.get("benchmarks", [])
                   if "mode" in b.get("extra_info", {})),
                  key=lambda x: (str(x.get("device")), x["mode"], x.get("batch", 0)))
    part = Part(["## Host overhead of the runtime", ""])
    if rows:
        commit = bench.get("pieceworks_commit")
        run = f"commit {commit[:12]}" if commit else "see results/README.md for the commit"
        part.lines += [f"Run {bench.get('datetime', '?')[:19]} UTC ({run}). pytest-benchmark "
                       "(`suites/test_host_overhead.py`): forward and the pieces' own work timed alone (graph "
                       "replays, splitting ops called directly) with CUDA events; overhead = forward − work (negative "
                       "where host work overlaps GPU work). Wall = pytest-benchmark's synchronised clock, 20 forwards "
                       "a round. Replay = the plan (PIECEWISE) or graph (FULL) of the padded size run alone on the "
                       "static buffers; forward / replay = what `CompiledModel.__call__` costs over it (argument "
                       "checks, static copies, cut back).", "",
                       *_table(HOST_COLUMNS, "llrrrrrrrrrr", ([
                           x.get("device"), x["mode"], x.get("batch", 4), x["pieces"], *(f"{x[k]:.1f}" for k in (
                               "forward_us", "compiled_pieces_alone_us", "splitting_ops_alone_us", "overhead_us")),
                           f"{x['overhead_per_piece_us']:.2f}", _fmt(x.get("replay_run_us"), 1),
                           _fmt(x.get("call_over_replay"), 3), f"{x['wall_us']:.1f}"] for x in rows))]
    else:
        part.add(Part([f"GPU (pytest-benchmark, `suites/test_host_overhead.py -m gpu`): not measured here ({reason}).",
                       ""], unmeasured=[f"Host overhead, GPU ({reason})"]))
    gpu, per_piece, call = [x for x in rows if x.get("device") != "cpu"], "overhead_per_piece_us", "call_vs_replay"
    part.add(target_row(r.label(per_piece), [(f"b{x['batch']}: {x[per_piece]:.2f} µs", x[per_piece] <= r.limit(
        per_piece)) for x in sorted(gpu, key=lambda x: x["batch"]) if x["mode"] == "PIECEWISE"], reason))
    part.add(target_row(r.label(call), [(f"{m} b{b}: {x:.3f}×", x <= r.limit(call)) for m, b, x in sorted(
        (x["mode"], x["batch"], x["call_over_replay"]) for x in gpu if x.get("call_over_replay") is not None)], reason))
    name = "host_overhead.HostOverheadCPU.track_"
    cpu = {m: [r.value(name + k, m) for k in ("forward_us", "overhead_per_forward_us", "overhead_per_piece_us")]
           for m in ("tiny", "toy_llama")}
    if any(v[0] is not None for v in cpu.values()):
        return part.add(Part(["asv, CPU (eager compiler, mode NONE, torch on one thread, host clock): µs.", "",
                              *_table(["model", "forward", "overhead per forward", "per piece"], "lrrr", (
                                  [m, _fmt(f), _fmt(o), _fmt(p, 2)] for m, (f, o, p) in cpu.items()))]))
    reason = r.skip_reason("host_overhead_cpu", needs_cuda=False)
    return part.add(Part([f"asv, CPU: not measured here ({reason}).", ""],
                         unmeasured=[f"Host overhead, CPU ({reason})"]))


# ---- side by side (harness.runtime_breakdown) ---------------------------------------------------------------------
def side_by_side(r: Results) -> Part:
    """Tables and target rows from `runtime_breakdown_<commit>.json` files: every variant in one process, timed in
    rotating rounds; each ratio the median of its per-round ratios, with their range."""
    runs = sorted(((name, doc) for name, doc in r.details.items() if name.startswith("runtime_breakdown")),
                  key=lambda item: item[1].get("date", ""))
    if not runs:
        return not_measured("Side by side, in rotating rounds", r.skip_reason("runtime_breakdown"))
    part = Part(["## Side by side, in rotating rounds", "",
                 "`python -m pieceworks.harness.runtime_breakdown`: ToyLlama, every variant built in one process and "
                 "timed with CUDA events in rounds whose order rotates (a slow spell of the shared host falls on all "
                 "of them alike); median µs; each ratio is the median of its per-round ratios, (min-max) over the "
                 "rounds. compiled call = PIECEWISE through `CompiledModel`; plan run = its replay plan alone; FULL "
                 "unsplit = FULL with `splitting_ops=[]`. Commit and date in each heading (`ci/main.sh` makes one "
                 "after the asv run on a GPU).", ""])
    found: dict[str | None, list[tuple[str, bool]]] = {key: [] for key in ROUND_RATIOS}  # ("a/b× (b1/b8)", met)
    missed: dict[str | None, list[tuple[str, bool | None]]] = {key: [] for key in ROUND_RATIOS}  # (miss, unsplit met)
    for file_name, doc in runs:
        for dtype, result in (doc.get("dtypes") or {}).items():
            part.lines += breakdown_table(r, breakdown_commit(file_name, doc), dtype, doc, result, found, missed)
    for key in (k for k in ROUND_RATIOS if found[k]):
        if key is None:
            part.targets.append(("FULL with splitting_ops=[] next to reduce-overhead, side by side (rounds; not a "
                                 "target: FULL without the split's cost)", ", ".join(t for t, _ in found[key]),
                                 "reference", ""))
            continue
        note = "misses, with the per-round range: " + "; ".join(m for m, _ in missed[key]) if missed[key] else ""
        if missed[key] and key == "call_vs_replay":
            note += "".join(call_profile_note(name, doc) for name, doc in runs)
        unsplit_meets = [met for _, met in missed[key] if met is not None]
        if missed[key] and unsplit_meets and all(unsplit_meets):
            note += (". Wherever FULL with splitting_ops=[] was timed in the same run, it meets the target at the "
                     "missed batch: the cost is the split's piece boundaries")
        part.add(target_row(r.label(key, "rounds_label"), found[key], "", note))
    return part


def breakdown_table(r: Results, commit: str, dtype: str, doc: dict, result: dict, found: dict,
                    missed: dict) -> list[str]:
    """The table of one dtype of one runtime_breakdown run; adds to `found` each ratio's medians ("commit dtype
    a/b× (b1/b8)", whether all met the target) and to `missed` each miss ("commit dtype bN x (min-max)", for FULL
    whether FULL unsplit met the limit in the same row, else None)."""
    rows = result.get("batches") or {}
    if not rows:
        return [f"{dtype} (commit {commit}): no rows ({result.get('crashed') or result.get('errors')})", ""]
    short = {"bfloat16": "bf16", "float32": "fp32"}.get(dtype, dtype)
    names = {key: ratio_name(r, key) for key in ROUND_RATIOS}
    shown = [v for v in SIDE_BY_SIDE if any(v in row["us"] for row in rows.values())]
    keys = [k for k in ROUND_RATIOS if any(names[k] in row.get("ratios", {}) for row in rows.values())]
    cells = []
    for batch, row in rows.items():
        ratios = row.get("ratios", {})
        cells.append([batch, *(_fmt(row["us"].get(v, {}).get("median_us"), 1) for v in shown),
                      *(f"{ratios[names[k]]['median']:.3f}{_range(ratios[names[k]], 3)}" if ratios.get(names[k])
                        else "n/a" for k in keys)])
        for key in (k for k in keys if k and ratios.get(names[k])):
            ratio, unsplit = ratios[names[key]], ratios.get(UNSPLIT) if key == "full_vs_reduce_overhead" else None
            if ratio["median"] > r.limit(key):
                missed[key].append((f"{commit} {short} b{batch} {ratio['median']:.2f}×{_range(ratio)}" + (
                    f", with splitting_ops=[] {unsplit['median']:.2f}×" if unsplit else ""),
                    unsplit["median"] <= r.limit(key) if unsplit else None))
    for key in keys:
        values = {b: row["ratios"][names[key]]["median"] for b, row in rows.items()
                  if row.get("ratios", {}).get(names[key])}
        found[key].append((f"{commit} {short} " + "/".join(f"{v:.2f}" for v in values.values()) + "× (b"
                           + "/".join(values) + ")", max(values.values()) <= r.limit(key or "full_vs_reduce_overhead")))
    return [f"### {dtype}, commit {commit}, {doc.get('date', '?')} ({doc.get('device', '?')}, torch "
            f"{doc.get('torch', '?')})", "", *_table(["batch", *shown, *(names[k] for k in keys)],
                                                     "r" * (1 + len(shown) + len(keys)), cells)]


def breakdown_commit(file_name: str, doc: dict) -> str:
    """The commit a `runtime_breakdown_<commit>.json` run measured: its own field, else its file name's."""
    return doc.get("commit") or file_name[len("runtime_breakdown_"):] or "?"


def ratio_name(r: Results, key: str | None) -> str:
    """The name the runtime_breakdown files give the ratio of target `key` (None: UNSPLIT)."""
    return r.targets[key]["ratio"] if key else UNSPLIT


def call_profile_note(file_name: str, doc: dict) -> str:
    """"; <commit> <dtype> b1 under cProfile (100 calls each ...): call 61 ms vs plan 48 ms, own time the call adds
    per forward: ..." for each dtype of one runtime_breakdown run that recorded a `call_profile`."""
    return "".join(
        f"; {breakdown_commit(file_name, doc)} {dtype} b{found['batch']} under cProfile ({found['calls']} calls each, profiler overhead "
        f"included): call {1e3 * found['seconds']['compiled call']:.0f} ms vs plan "
        f"{1e3 * found['seconds']['plan run']:.0f} ms, own time the call adds per forward: " + ", ".join(
            f"`{a['function']}` {a['us_per_call']:.1f} µs in {a['calls_per_call']:g} calls" for a in found["added"][:5])
        for dtype, result in (doc.get("dtypes") or {}).items()
        if (found := result.get("call_profile")) and found.get("added"))


# ---- dispatch, code size ------------------------------------------------------------------------------------------
def dispatch(r: Results) -> Part:
    rows = sorted((n.split(".")[-1], _fmt(v.get(()) and v.get(()) * 1e6)) for n, v in r.asv.items()
                  if n.startswith("dispatch."))
    if not rows:
        return not_measured("Dispatch (CPU)", r.skip_reason("dispatch", needs_cuda=False))
    return Part(["## Dispatch (CPU, per sweep of 600 batch sizes)", "", *_table(["benchmark", "µs"], "lr", rows)])


def code_size(r: Results) -> Part:
    """The project's own check of the reference core's size, from the asv run's `code_size` benchmark."""
    name = "code_size.ReferenceCore.track_lines"
    lines, code, label = r.value(name, "lines"), r.value(name, "code"), r.label("core_lines")
    if code is None:
        return Part(own_checks=[(label, r.skip_reason("code_size", needs_cuda=False), _verdict(None), "")])
    files = {k: v for k, v in r.details.get("code_size", {}).get("files", {}).items() if k != "total"}
    largest = sorted(files.items(), key=lambda kv: -kv[1]["code"])[:5]
    within = code <= r.limit("core_lines")
    note = "largest (code lines): " + ", ".join(f"{k} {v['code']}" for k, v in largest) if largest else ""
    return Part(own_checks=[(label, f"{code:,.0f} code lines, {lines:,.0f} in all, {len(files) or '?'} files",
                             "within" if within else "over", "" if within else note)])


# ---- assembly -----------------------------------------------------------------------------------------------------
SECTIONS = (latency, memory, compile_starts, host_overhead, side_by_side, dispatch, code_size)


def render(r: Results, machine: str, source: str) -> tuple[str, Part]:
    """The whole report, and what its sections add up to (plots, unmeasured sections); `source` names where its
    result files come from (see `result_files_source`)."""
    body, env, modules, skips = Part(), r.environment, {}, {}
    for section in SECTIONS:
        body.add(section(r))
    for name, commit in sorted(r.commits.items()):
        modules.setdefault(commit[:12], set()).add(name.split(".")[0])
    for name, doc in r.details.items():
        for key, entry in (doc.get("entries") or {}).items():
            if isinstance(entry, dict) and ("skip" in entry or "error" in entry):
                skips.setdefault((name, key.split("|")[0]), entry.get("skip") or f"ERROR: {entry['error']}")
    commits = "commit " + ", ".join(f"{c} ({', '.join(sorted(m))})" for c, m in modules.items()) if modules else "?"
    text = [f"# Benchmark report: {machine}", "",
            f"Generated by `python -m pieceworks.harness.report` from {source}; no number is edited by hand.", "",
            f"- device: {env.get('device', '?')} (driver {env.get('driver')}, CUDA {env.get('cuda')})",
            f"- torch {env.get('torch')}, Triton {env.get('triton')}, Python {env.get('python')}",
            f"- run: {env.get('date', '?')}, asv machine `{machine}` ({r.cpu}); asv results of {commits}", "",
            "## Targets (ratios from one run; reported, never asserted)", "",
            *_table(["target", "measured", "verdict", "where the time goes (misses)"], "llll", body.targets),
            *body.lines, "## The project's own checks (goals for its code, not product targets)", "",
            *_table(["check", "measured", "verdict", "note"], "llll", body.own_checks)]
    if skips:
        text += ["## Skipped and failed entries", "", *(f"- {n} / {i}: {why}" for (n, i), why in sorted(skips.items())),
                 ""]
    if body.plots:
        text += ["## Plots", "", *(f"![{p}](plots/{p})" for p, _ in body.plots), ""]
    return "\n".join(text), body


def write_plots(plots: list[tuple[str, Callable[[Any], None]]], folder: str) -> list[str]:
    """Each plot as `folder`/<file name> (PNG); none without matplotlib. Returns the paths written."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    os.makedirs(folder, exist_ok=True)
    for filename, draw in plots:
        fig, ax = plt.subplots(figsize=(7, 4.5))
        draw(ax)
        fig.tight_layout()
        fig.savefig(os.path.join(folder, filename), dpi=110)
        plt.close(fig)
    return [os.path.join(folder, filename) for filename, _ in plots]


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
    parser.add_argument("--machine", default=None, help="asv machine name (default: the only one, or the newest)")
    parser.add_argument("--commit", default=None, help="asv results of this commit only (default: each one's newest)")
    parser.add_argument("--no-plots", action="store_true", help="REPORT.md only (its plot links stay as they are)")
    args = parser.parse_args(argv)
    machines = sorted((os.path.getmtime(p), os.path.basename(os.path.dirname(p)))
                      for p in glob.glob(os.path.join(args.results, "asv", "*", "machine.json")))
    machine = args.machine or (machines[-1][1] if machines else None)
    try:
        if machine is None:
            raise ResultSetError(f"no asv results under {os.path.join(args.results, 'asv')}")
        results = load_results(args.results, machine, args.commit)
    except ResultSetError as exc:
        print(f"report: {exc}: run the benchmarks first", file=sys.stderr)
        return 1
    text, body = render(results, machine, result_files_source(results.files, args.results))
    bench_dir = os.path.join(args.results, "bench", machine)
    os.makedirs(bench_dir, exist_ok=True)
    plots = [] if args.no_plots else write_plots(body.plots, os.path.join(bench_dir, "plots"))
    with open(os.path.join(bench_dir, "REPORT.md"), "w") as f:
        f.write(text)
    print(f"report: wrote {os.path.join(bench_dir, 'REPORT.md')} and {len(plots)} plots")
    for section in body.unmeasured:
        print(f"report: not measured here: {section}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
