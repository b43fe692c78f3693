"""The benchmark report: tables, target verdicts and PNG plots, regenerated from result files.

`python -m pieceworks.harness.report --machine NAME` reads
- asv's results for that machine (`results/asv/NAME/<commit>-<env>.json`: each benchmark from the newest run that
  has it, or from `--commit`'s run only);
- the details the suites wrote beside them (`results/bench/NAME/*.json`: environment, skip reasons, errors
  against eager, kernel profiles);
- pytest-benchmark's JSON of the host-overhead suite (`results/bench/NAME/host_overhead.json`), if present;
- side-by-side profiles (`results/bench/NAME/profile_*.json`, `python -m pieceworks.harness.profile --out`), which
  explain a target's misses where the latency run profiled only one side of the ratio;
- side-by-side timings in rotating rounds (`results/bench/NAME/runtime_breakdown_<commit>.json`,
  `python -m pieceworks.harness.runtime_breakdown --out`): tables and target rows of their own;
and writes `results/bench/NAME/REPORT.md` and `results/bench/NAME/plots/*.png` (matplotlib; without it, the
tables only). Every ratio is computed from numbers of the same run. Nothing is measured here: a section without
numbers says "not measured here" and why, and the header says "committed" only for result files git tracks unmodified.
"""

from __future__ import annotations

import argparse
import ast
import glob
import json
import math
import os
import subprocess
import sys
from typing import Any

__all__ = ["load_asv", "main"]

TARGETS = {
    "piecewise_vs_pcg": 0.9, "full_vs_reduce_overhead": 1.02, "pool_51_vs_largest": 1.05, "capture_51_s": 1.0,
    "warm_vs_cold": 0.10, "overhead_per_piece_us": 2.0, "call_vs_replay": 1.03,
}
OWN_CHECKS = {"core_lines": 1600}  # the project's goals for its own code, not product targets
LIBRARY_DOMINATES = 0.5  # a library kernel family above this share of GPU time dominates the batch size


def asv_files(results_dir: str, machine: str, commit: str | None = None) -> list[str]:
    """The asv result files of `machine` (of `commit` only, if given)."""
    files = [f for f in glob.glob(os.path.join(results_dir, machine, "*.json")) if not f.endswith("machine.json")]
    if commit:
        files = [f for f in files if os.path.basename(f).startswith(commit[:8])]
    if not files:
        raise FileNotFoundError(f"no asv results for machine {machine!r} in {results_dir}"
                                + (f" at commit {commit}" if commit else "") + ": run the benchmarks first")
    return sorted(files)


def _started(row: list) -> float:
    return row[3] if len(row) > 3 and row[3] else 0


def newest_asv_file(results_dir: str, machine: str, commit: str | None = None) -> str:
    """The asv result file of `machine` (of `commit`, if given) whose benchmarks started last: the run the gate's
    own checks read."""
    return max(asv_files(results_dir, machine, commit),
               key=lambda path: max(map(_started, json.load(open(path))["results"].values()), default=0))


def load_asv(results_dir: str, machine: str, commit: str | None = None) -> tuple[dict[str, dict], dict[str, Any]]:
    """{benchmark name: {params tuple: value}}, each benchmark from the run of `machine` that started it last (of
    `commit` only, if given), and the header: {benchmark name: commit} under "commits", the files read under "files"."""
    files = asv_files(results_dir, machine, commit)
    rows: dict[str, tuple[list, dict]] = {}
    for path in files:
        doc = json.load(open(path))
        for name, row in doc["results"].items():
            if name not in rows or _started(row) > _started(rows[name][0]):
                rows[name] = (row, doc)
    table = {name: _values(dict(zip(doc["result_columns"], row))) for name, (row, doc) in rows.items()}
    newest = max(rows.values(), key=lambda found: _started(found[0]))[1] if rows else {}
    return table, {"params": newest.get("params"), "files": files,
                   "commits": {name: doc["commit_hash"] for name, (_, doc) in rows.items()}}


def _values(row: dict) -> dict[tuple, Any]:
    """{params tuple: value} of one asv result row; None for a skipped or failed value."""
    values = row["result"] if isinstance(row["result"], list) else [row["result"]]
    params = [[ast.literal_eval(p) for p in ps] for ps in row.get("params") or []]
    keys = _product(params) if params else [()]
    return {k: (None if v is None or (isinstance(v, float) and math.isnan(v)) else v) for k, v in zip(keys, values)}


def _product(params: list[list[Any]]) -> list[tuple]:
    keys: list[tuple] = [()]
    for values in params:
        keys = [k + (v,) for k in keys for v in values]
    return keys


def _details(folder: str) -> dict[str, Any]:
    found = {}
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        name = os.path.splitext(os.path.basename(path))[0]
        with open(path) as f:
            found[name] = json.load(f)
    return found


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _both_sides(impls: tuple[str, str], medians: list[float | None], profiles: list[dict]) -> str:
    """"A 255 µs, kernels 225 µs (88% busy) vs B ...; kernels only in A: ..." for the two sides of a ratio."""
    return " vs ".join(
        f"{i} {_fmt(m, 0)} µs, kernels {p['device_us_per_call']:.0f} µs"
        f" ({_fmt(m and 100 * p['device_us_per_call'] / m, 0)}% busy)"
        for i, m, p in zip(impls, medians, profiles)) + _difference(impls, *profiles)


def _difference(impls: tuple[str, str], first: dict, second: dict) -> str:
    """"; kernels only in A: ..." from two kernel profiles (see `profile.kernels_only_in`), or ""."""
    from pieceworks.harness.profile import kernels_only_in

    only = kernels_only_in(first, second)
    if not only:
        return ""
    return f"; kernels only in {impls[0]}: " + ", ".join(
        f"`{name[:48]}` {us:.1f} µs in {calls:.0f} launches" for name, us, calls in only)


def _breakdown_commit(name: str, doc: dict) -> str:
    """The commit a `runtime_breakdown_<commit>.json` run measured: its own field, else its file name's."""
    return doc.get("commit") or name[len("runtime_breakdown_"):] or "?"


def _verdict(ok: bool | None) -> str:
    return "not measured" if ok is None else ("met" if ok else "**missed**")


class Report:
    """Builds the Markdown lines and the plots from one machine's result files."""

    def __init__(self, asv: dict[str, dict], header: dict[str, Any], details: dict[str, Any]) -> None:
        self.asv, self.header, self.details = asv, header, details
        self.lines: list[str] = []
        self.targets: list[tuple[str, str, str, str]] = []
        self.own_checks: list[tuple[str, str, str, str]] = []
        self.unmeasured: list[str] = []  # "section (reason)" of each section with no numbers
        self.plots: list[tuple[str, Any]] = []
        self.environment = (details.get("environment") or next(
            (d for d in details.values() if "environment" in d), {})).get("environment", {})

    def value(self, name: str, *key: Any) -> Any:
        return self.asv.get(name, {}).get(tuple(key))

    # ---- latency --------------------------------------------------------------------------------------------
    LATENCY_RATIOS = {"PIECEWISE / meta-pcg": ("pieceworks-piecewise", "meta-pcg"),
                      "FULL / reduce-overhead": ("pieceworks-full", "reduce-overhead")}

    LATENCY_CLASSES = [("ToyLlamaBfloat16", "toy_llama", "bfloat16"), ("ToyLlamaFloat32", "toy_llama", "float32"),
                       ("SillyBfloat16", "silly", "bfloat16"), ("SillyFloat32", "silly", "float32")]

    def latency(self) -> None:
        worst: dict[str, list] = {key: [] for key in self.LATENCY_RATIOS}
        tables = {(model, dtype): self._latency_table(cls, model, dtype, worst)
                  for cls, model, dtype in self.LATENCY_CLASSES}
        if not any(tables.values()):
            self._not_measured("Latency", self._skip_reason("latency_toy_llama_bfloat16"))
        else:
            self.lines += ["## Latency", "",
                           "Median µs per forward (CUDA events, 200 samples after 20 warm-up calls), IQR in brackets; "
                           "every number of a table comes from one process. Ratios: PIECEWISE / Meta pcg and FULL / "
                           "reduce-overhead, from the same table. Where the run timed implementations side by side in "
                           "rotating rounds (listed under the table), a ratio is the median of its per-round ratios, "
                           "(min-max) over the rounds; in older runs, each implementation was timed in turn and a "
                           "ratio is one median over the other.", ""]
            for (model, dtype), table in tables.items():
                self.lines += table or [f"{model} {dtype}: not measured here "
                                        f"({self._skip_reason(f'latency_{model}_{dtype}')})", ""]
        self._latency_targets(worst)
        self._profiles()

    def _latency_table(self, cls: str, model: str, dtype: str, worst: dict[str, list]) -> list[str]:
        """The table of one latency class (no lines where nothing was measured); adds ToyLlama's ratios to `worst`."""
        name = f"latency.{cls}.track_median_us"
        found = self.asv.get(name, {})
        iqr = self.asv.get(f"latency.{cls}.track_iqr_us", {})
        details = self.details.get(f"latency_{model}_{dtype}", {})
        rounds = details.get("ratios", {})
        impls = list(dict.fromkeys(k[0] for k in found))
        batches = sorted({k[1] for k in found})
        present = [i for i in impls if any(found.get((i, b)) is not None for b in batches)]
        if not present:
            return []
        lines = [f"### {model}, {dtype}", "",
                 "| batch | " + " | ".join(present) + " | PIECEWISE / pcg | FULL / reduce-overhead |",
                 "|---:|" + "---:|" * (len(present) + 2)]
        series: dict[str, list] = {i: [] for i in present}
        for b in batches:
            cells = []
            for i in present:
                med, spread = found.get((i, b)), iqr.get((i, b))
                series[i].append(med)
                cells.append("n/a" if med is None else f"{med:.0f} ({_fmt(spread, 0)})")
            ratios = []
            for key, (a, c) in self.LATENCY_RATIOS.items():
                ratio, spread = self._latency_ratio(rounds.get(str(b), {}).get(key), found.get((a, b)),
                                                    found.get((c, b)))
                ratios.append(f"{_fmt(ratio, 2)}×" + (f" ({spread['min']:.2f}-{spread['max']:.2f})" if spread else ""))
                if model == "toy_llama":
                    worst[key].append((ratio, dtype, b, spread))
            lines.append(f"| {b} | " + " | ".join(cells + ratios) + " |")
        if details.get("side_by_side"):
            lines += ["", f"Timed side by side in {details.get('rounds')} rotating rounds: "
                      f"{', '.join(details['side_by_side'])}; the others each alone, before them."]
        self.plots.append((f"latency_{model}_{dtype}.png", (f"{model}, {dtype}: latency vs batch", batches, series)))
        return lines + [""]

    @staticmethod
    def _latency_ratio(in_rounds: dict | None, top: float | None, bottom: float | None) -> tuple[float | None, Any]:
        """(ratio, its per-round spread or None): the median of the per-round ratios where the run timed both sides
        in rotating rounds, else (older runs, each timed in turn) one median over the other."""
        if in_rounds:
            return in_rounds["median"], in_rounds
        return (top / bottom if top and bottom else None), None

    def _latency_targets(self, worst: dict[str, list]) -> None:
        for key, label, limit in (
            ("PIECEWISE / meta-pcg", "PIECEWISE ≤ 0.9× Meta pcg, every batch, both dtypes (ToyLlama)",
             TARGETS["piecewise_vs_pcg"]),
            ("FULL / reduce-overhead", "FULL ≤ 1.02× reduce-overhead, every batch, both dtypes (ToyLlama)",
             TARGETS["full_vs_reduce_overhead"]),
        ):
            ratios = [(r, d, b, spread) for r, d, b, spread in worst[key] if r is not None]
            if not ratios:
                self._target_not_measured(label, self._skip_reason("latency_toy_llama_bfloat16"))
                continue
            misses = [(r, d, b) for r, d, b, _ in ratios if r > limit]
            measured = ", ".join(f"{d} b{b}: {r:.2f}×" + (f" ({s['min']:.2f}-{s['max']:.2f})" if s else "")
                                 for r, d, b, s in ratios)
            what = self.LATENCY_RATIOS[key]
            note = "; ".join(self._profile_note(d, b, what) for _, d, b in sorted(misses, reverse=True)[:3])
            self.targets.append((label, measured, _verdict(not misses), note))

    def _side_by_side(self, dtype: str, batch: int, impls: tuple[str, str]) -> str | None:
        """Both sides of a ratio from one side-by-side profile file (same dtype and batch), or None."""
        for doc in self._profile_files():
            first, second = (f"{i}|{batch}" for i in impls)
            if doc.get("dtype") != dtype or not all(k in doc["profiles"] for k in (first, second)):
                continue
            return f"{dtype} b{batch} (side-by-side profile): " + _both_sides(
                impls, [doc["timings"][k]["median_us"] for k in (first, second)],
                [doc["profiles"][k] for k in (first, second)])
        return None

    def _profile_files(self) -> list[dict]:
        return [d for name, d in sorted(self.details.items()) if name.startswith("profile_") and "profiles" in d]

    def _profile_note(self, dtype: str, batch: int, impls: tuple[str, str]) -> str:
        profiles = self.details.get(f"latency_toy_llama_{dtype}", {}).get("profiles", {})
        entries = self.details.get(f"latency_toy_llama_{dtype}", {}).get("entries", {})
        if not all(f"{i}|{batch}" in profiles for i in impls):
            found = self._side_by_side(dtype, batch, impls)
            if found is not None:
                return found
        if all(f"{i}|{batch}" in profiles for i in impls):
            return f"{dtype} b{batch}: " + _both_sides(
                impls, [entries.get(f"{i}|{batch}", {}).get("median_us") for i in impls],
                [profiles[f"{i}|{batch}"] for i in impls])
        parts = []
        for impl in (impls[0], impls[1], "eager"):
            prof = profiles.get(f"{impl}|{batch}")
            med = entries.get(f"{impl}|{batch}", {}).get("median_us")
            if not prof or not prof.get("top"):
                continue
            top = prof["top"][0]
            busy = prof["device_us_per_call"] / med if med else None
            parts.append(f"{impl}: kernels {prof['device_us_per_call']:.0f} µs of {_fmt(med, 0)} µs"
                         f" (GPU busy {_fmt(busy and 100 * busy, 0)}%), top {top['kind']} kernel "
                         f"{top['us_per_call']:.0f} µs/forward ({100 * top['share']:.0f}%)")
            break
        return f"{dtype} b{batch}: " + ("; ".join(parts) if parts else "no profile recorded")

    def _profiles(self) -> None:
        rows, side = [], []
        for dtype in ("bfloat16", "float32"):
            profiles = self.details.get(f"latency_toy_llama_{dtype}", {}).get("profiles", {})
            for key, prof in sorted(profiles.items(), key=lambda kv: (kv[0].split("|")[0], int(kv[0].split("|")[1]))):
                impl, batch = key.split("|")
                if not prof.get("top"):
                    continue
                top = prof["top"][0]
                dominated = prof["library_share"] >= LIBRARY_DOMINATES
                rows.append(f"| {dtype} | {impl} | {batch} | {prof['device_us_per_call']:.0f} | "
                            f"{100 * prof['library_share']:.0f}%{' (library dominates)' if dominated else ''} | "
                            f"`{top['name'][:70]}` {top['us_per_call'] / max(top['calls_per_call'], 1):.1f} µs × "
                            f"{top['calls_per_call']:.0f} |")
        for doc in self._profile_files():
            for key, prof in doc["profiles"].items():
                impl, batch = key.split("|")
                med = doc["timings"][key]["median_us"]
                kernels = "; ".join(f"`{k['name'][:48]}` {k['us_per_call']:.1f} µs × {k['calls_per_call']:.0f}"
                                    for k in prof["top"][:4])
                side.append(f"| {doc['dtype']} | {impl} | {batch} | {med:.1f} | {prof['device_us_per_call']:.0f} | "
                            f"{100 * prof['device_us_per_call'] / med:.0f}% | {kernels} |")
        if rows:
            self.lines += ["### Kernel profiles (torch.profiler, once per size; ToyLlama)", "",
                           "GPU kernel µs per forward, the share of library GEMM/GEMV kernels (cuBLAS, cuBLASLt, "
                           f"CUTLASS; ≥ {100 * LIBRARY_DOMINATES:.0f}% = the library, not the implementation, "
                           "dominates that size), and the top kernel (µs per call × calls per forward).", "",
                           "| dtype | implementation | batch | kernel µs | library share | top kernel |",
                           "|---|---|---:|---:|---:|---|", *rows, ""]
        if side:
            self.lines += ["### Side-by-side profiles (`python -m pieceworks.harness.profile`; ToyLlama 12 layers)", "",
                           "Both sides of a target ratio built, timed (CUDA events, median of 200) and then profiled in "
                           "one process; kernel µs = GPU kernel time per forward (graph replays included); busy = "
                           "kernel time / median. The top kernels: µs per forward × launches per forward. Runs: "
                           + "; ".join(f"{d.get('device')}, torch {d.get('torch')}, {d.get('date') or 'date: see results/README.md'}"
                                       f"{', commit ' + d['commit'][:12] if d.get('commit') else ''}"
                                       for d in self._profile_files()) + ".", "",
                           "| dtype | implementation | batch | median µs | kernel µs | busy | top kernels |",
                           "|---|---|---:|---:|---:|---:|---|", *side, ""]

    # ---- memory and capture ---------------------------------------------------------------------------------
    def memory(self) -> None:
        base = "memory.CaptureMemory."
        if self.value(base + "track_pool_mib", "PIECEWISE", 1) is None and \
                self.value(base + "track_pool_mib", "FULL", 1) is None:
            reason = self._skip_reason("memory")
            self._not_measured("Memory and capture", reason)
            for label in ("pool for 51 sizes ≤ 1.05× the largest size alone", "capture of 51 sizes ≤ 1 s"):
                self._target_not_measured(label, reason)
            return
        nvml = self.details.get("memory", {}).get("nvml", "")
        self.lines += ["## Memory and capture (ToyLlama 12 layers, bfloat16)", "",
                       "n sizes = the largest n of vLLM's 51 capture sizes (n = 1: 512 alone). One pool: one model "
                       "capturing all n. Unshared: one model per size, each its own pool, all alive. MiB.",
                       f"NVML: {nvml}", "",
                       "| mode | sizes | pool | reserved Δ | NVML used Δ | unshared pool | unshared reserved Δ | "
                       "unshared NVML Δ | capture s |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        series = {}
        for mode in ("PIECEWISE", "FULL"):
            series[mode] = {}
            for n in (1, 8, 51):
                v = {k: self.value(base + f"track_{k}", mode, n) for k in (
                    "pool_mib", "reserved_delta_mib", "nvml_used_delta_mib", "unshared_pool_mib",
                    "unshared_reserved_delta_mib", "unshared_nvml_used_delta_mib", "capture_seconds")}
                series[mode][n] = v
                self.lines.append(f"| {mode} | {n} | " + " | ".join(_fmt(x, 2 if k == "capture_seconds" else 1)
                                                                       for k, x in v.items()) + " |")
        self.lines.append("")
        pool_ratios = {m: (s[51]["pool_mib"] / s[1]["pool_mib"]) if s[51]["pool_mib"] and s[1]["pool_mib"] else None
                       for m, s in series.items()}
        ok = all(r is not None and r <= TARGETS["pool_51_vs_largest"] for r in pool_ratios.values())
        self.targets.append(("pool for 51 sizes ≤ 1.05× the largest size alone",
                             ", ".join(f"{m}: {_fmt(r, 3)}×" for m, r in pool_ratios.items()), _verdict(ok), ""))
        captures = {m: s[51]["capture_seconds"] for m, s in series.items()}
        ok = all(c is not None and c <= TARGETS["capture_51_s"] for c in captures.values())
        misses = [m for m, c in captures.items() if c is not None and c > TARGETS["capture_51_s"]]
        self.targets.append(("capture of 51 sizes ≤ 1 s", ", ".join(f"{m}: {_fmt(c, 2)} s" for m, c in captures.items()),
                             _verdict(ok), "; ".join(filter(None, (self._capture_note(m) for m in misses)))))
        self.plots.append(("pool_vs_sizes.png", series))

    def _capture_note(self, mode: str) -> str:
        """Where a capture phase's time goes, from the memory benchmark's details: the first size (warm-up runs,
        first allocations) against each further graph, e.g. "PIECEWISE: 663 graphs; 1 size (13 graphs) 0.27 s, then
        1.37 ms a graph"."""
        entries = self.details.get("memory", {}).get("entries", {})
        one, all_ = entries.get(f"{mode}|1", {}), entries.get(f"{mode}|51", {})
        if not all(isinstance(e.get(k), (int, float)) for e in (one, all_) for k in ("capture_seconds", "graphs")) \
                or all_["graphs"] <= one["graphs"]:
            return ""
        per_graph = (all_["capture_seconds"] - one["capture_seconds"]) / (all_["graphs"] - one["graphs"])
        profile = self.details.get("memory", {}).get("capture_profiles", {}).get(mode)
        where = "" if not profile else (
            f"; under cProfile ({profile['seconds']:.2f} s), own time: " + ", ".join(
                f"`{r['function']}` {r['tottime_s']:.2f} s in {r['calls']} calls" for r in profile["top"][:5]))
        return (f"{mode}: {all_['graphs']} graphs; 1 size ({one['graphs']} graphs) {one['capture_seconds']:.2f} s, "
                f"then {1e3 * per_graph:.2f} ms a graph{where}")

    # ---- compile --------------------------------------------------------------------------------------------
    def compile(self) -> None:
        base = "compile.CompileStart."
        starts = ("cold", "warm", "warm_new_host")
        rows = {s: {k: self.value(base + f"track_{k}", s) for k in (
            "first_call_seconds", "process_seconds", "inductor_compiles", "artifacts_loaded")} for s in starts}
        device = self.details.get("compile", {}).get("device", "?")
        self.lines += ["## Compile: cold, warm, warm on a new host", ""]
        later_measured, later_ok, later_notes = self._warm_start_runs()
        if rows["cold"]["first_call_seconds"] is None:
            reason = self._skip_reason("compile", needs_cuda=False)
            self.lines += [f"asv: not measured here ({reason}).", ""]
            self.unmeasured.append(f"Compile ({reason})")
            self.targets.append(("warm start: 0 Inductor compiles, ≤ 10% of cold (also new host)",
                                 "; ".join(later_measured) or reason,
                                 _verdict(all(later_ok) if later_ok else None), "; ".join(later_notes)))
            return
        cold = rows["cold"]["first_call_seconds"]
        entries = self.details.get("compile", {}).get("entries", {})
        self.lines += [f"ToyLlama 12 layers on {device}, each start a fresh process; first call = trace + compile or "
                       "load. Of the first call: in the backend = the pieceworks backend (split, cache key, compile "
                       "or load), of which compile or load = the pieces; outside = Dynamo's trace, its guards and "
                       "one run of the model (n/a: a run before this breakdown was recorded).", "",
                       "| start | first call s | vs cold | in the backend s | compile or load s | outside s | "
                       "process s | Inductor compiles | artifacts loaded |",
                       "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for s in starts:
            self.lines.append(f"| {s} | " + self._start_cells({**entries.get(s, {}), **rows[s]}, cold))
        self.lines.append("")
        verdicts, measured, notes = [], [], []
        for s in ("warm", "warm_new_host"):
            r = rows[s]
            ratio = r["first_call_seconds"] / cold if r["first_call_seconds"] is not None else None
            ok = r["inductor_compiles"] == 0 and ratio is not None and ratio <= TARGETS["warm_vs_cold"]
            verdicts.append(ok)
            measured.append(f"{s}: {_fmt(ratio, 2)}× cold, {_fmt(r['inductor_compiles'], 0)} compiles")
            note = self._first_call_note(s, entries.get(s, {}), r["first_call_seconds"],
                                         " (Dynamo's trace, guards, one run)")
            if not ok and note:
                notes.append(note)
        self.targets.append((f"warm start: 0 Inductor compiles, ≤ 10% of cold (also new host; {device})",
                             "; ".join(measured + later_measured), _verdict(all(verdicts + later_ok)),
                             "; ".join(notes + later_notes)))
        self.plots.append(("compile_starts.png", rows))

    def _warm_start_runs(self) -> tuple[list[str], list[bool], list[str]]:
        """A table of the `warm_start_<label>.json` runs (`python -m pieceworks.harness.warm_start`), placed before
        the asv table; returns, for the target row, what each warm start measured, whether it met the target, and
        where each run's warm first call went."""
        runs = sorted(((name[len("warm_start_"):], doc) for name, doc in self.details.items()
                       if name.startswith("warm_start_")), key=lambda item: (item[1].get("date", ""), item[0]))
        if not runs:
            return [], [], []
        self.lines += ["Runs of `python -m pieceworks.harness.warm_start` (ToyLlama 12 layers, each start a fresh "
                       "process; label = commit, and what else differed); first call = trace + compile or load + "
                       "one run, of it: in the backend (of which compile or load) and outside (Dynamo's trace, its "
                       "guards, one run). These runs are later than the asv run below.", "",
                       "| run | start | first call s | vs cold | in the backend s | compile or load s | outside s | "
                       "process s | Inductor compiles | artifacts loaded |",
                       "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        measured, met, notes = [], [], []
        for label, doc in runs:
            starts = doc.get("starts") or {}
            cold = (starts.get("cold") or {}).get("first_call_seconds")
            for start, r in starts.items():
                first = r.get("first_call_seconds")
                ratio = first / cold if first is not None and cold else None
                self.lines.append(f"| {label} | {start} | " + self._start_cells(r, cold))
                if start == "cold" or ratio is None:
                    continue
                met.append(r.get("inductor_compiles") == 0 and ratio <= TARGETS["warm_vs_cold"])
                measured.append(f"{label} {start}: {ratio:.2f}×")
                note = self._first_call_note(f"{label} {start}", r, first)
                if start == "warm" and note:
                    notes.append(note)
        self.lines.append("")
        return measured, met, notes

    def _start_cells(self, entry: dict, cold: float | None) -> str:
        """The cells after the start's name in a compile table: first call, vs cold, in the backend, compile or load,
        outside, process, Inductor compiles, artifacts loaded (a compile benchmark entry or a warm_start start)."""
        first = entry.get("first_call_seconds")
        ratio = first / cold if first is not None and cold else None
        backend, pieces, outside = self._first_call_parts(entry, first)
        return (f"{_fmt(first, 2)} | {_fmt(ratio, 2)} | {_fmt(backend, 2)} | {_fmt(pieces, 2)} | {_fmt(outside, 2)} | "
                f"{_fmt(entry.get('process_seconds'), 1)} | {_fmt(entry.get('inductor_compiles'), 0)} | "
                f"{_fmt(entry.get('artifacts_loaded'), 0)} |")

    def _first_call_note(self, label: str, entry: dict, first: float | None, outside_is: str = "") -> str:
        """"label: F s = O s outside the backend + B s in it, L s of which loading the pieces", or "" where the
        run recorded no breakdown."""
        backend, pieces, outside = self._first_call_parts(entry, first)
        if backend is None:
            return ""
        return (f"{label}: {_fmt(first, 2)} s = {_fmt(outside, 2)} s outside the backend{outside_is} + "
                f"{_fmt(backend, 2)} s in it, {_fmt(pieces, 2)} s of which loading the pieces")

    @staticmethod
    def _first_call_parts(entry: dict, first_call: float | None) -> tuple[float | None, float | None, float | None]:
        """(seconds in the backend, of which compiling or loading the pieces, seconds outside the backend) of a
        compile start's first call; Nones where the run did not record them."""
        backend, pieces = entry.get("backend_seconds"), entry.get("compile_or_load_seconds")
        outside = first_call - backend if backend is not None and first_call is not None else None
        return backend, pieces, outside

    # ---- host overhead --------------------------------------------------------------------------------------
    def host_overhead(self, pytest_benchmark: dict | None) -> None:
        self.lines += ["## Host overhead of the runtime", ""]
        gpu_reason = self._skip_reason("host_overhead")
        gpu_rows = []
        for bench in (pytest_benchmark or {}).get("benchmarks", []):
            info = bench.get("extra_info", {})
            if "mode" not in info:
                continue
            gpu_rows.append(info | {"wall_us": bench["stats"]["median"] * 1e6, "test": bench["name"]})
        if gpu_rows:
            commit = (pytest_benchmark or {}).get("pieceworks_commit")
            self.lines += [f"Run {(pytest_benchmark or {}).get('datetime', '?')[:19]} UTC ("
                           + (f"commit {commit[:12]}" if commit else "see results/README.md for the commit") + "). "
                           "pytest-benchmark (`suites/test_host_overhead.py`): forward and the pieces' own work "
                           "timed alone (graph replays, splitting ops called directly) with CUDA events; overhead = "
                           "forward − work (negative where host work overlaps GPU work). Wall = pytest-benchmark's "
                           "synchronised clock, 20 forwards a round. Replay = the plan (PIECEWISE) or graph (FULL) "
                           "of the padded size run alone on the static buffers; forward / replay = what "
                           "`CompiledModel.__call__` costs over it (argument checks, static copies, cut back).", "",
                           "| device | mode | batch | pieces | forward µs | compiled pieces alone (graph replays) | "
                           "splitting ops alone | overhead µs | per piece µs | replay µs | forward / replay | "
                           "wall µs |",
                           "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
            for r in sorted(gpu_rows, key=lambda r: (str(r.get("device")), r["mode"], r.get("batch", 0))):
                self.lines.append(
                    f"| {r.get('device')} | {r['mode']} | {r.get('batch', 4)} | {r['pieces']} | "
                    f"{r['forward_us']:.1f} | {r['compiled_pieces_alone_us']:.1f} | {r['splitting_ops_alone_us']:.1f}"
                    f" | {r['overhead_us']:.1f} | {r['overhead_per_piece_us']:.2f} | {_fmt(r.get('replay_run_us'), 1)}"
                    f" | {_fmt(r.get('call_over_replay'), 3)} | {r['wall_us']:.1f} |")
            self.lines.append("")
        else:
            self.lines += ["GPU (pytest-benchmark, `suites/test_host_overhead.py -m gpu`): not measured here "
                           f"({gpu_reason}).", ""]
            self.unmeasured.append(f"Host overhead, GPU ({gpu_reason})")
        piecewise = [r for r in gpu_rows if r["mode"] == "PIECEWISE" and r.get("device") != "cpu"]
        if piecewise:
            ok = all(r["overhead_per_piece_us"] <= TARGETS["overhead_per_piece_us"] for r in piecewise)
            self.targets.append(("host overhead ≤ 2 µs per piece (PIECEWISE, GPU)", ", ".join(
                f"b{r['batch']}: {r['overhead_per_piece_us']:.2f} µs" for r in sorted(piecewise, key=lambda r: r["batch"])),
                _verdict(ok), ""))
        else:
            self._target_not_measured("host overhead ≤ 2 µs per piece (PIECEWISE, GPU)", gpu_reason)
        ratios = sorted((r["mode"], r["batch"], r["call_over_replay"]) for r in gpu_rows
                        if r.get("call_over_replay") is not None and r.get("device") != "cpu")
        if ratios:
            self.targets.append(("CompiledModel call ≤ 1.03× its replay run alone (GPU)", ", ".join(
                f"{m} b{b}: {x:.3f}×" for m, b, x in ratios),
                _verdict(all(x <= TARGETS["call_vs_replay"] for _, _, x in ratios)), ""))
        else:
            self._target_not_measured("CompiledModel call ≤ 1.03× its replay run alone (GPU)", gpu_reason)
        base = "host_overhead.HostOverheadCPU."
        cpu = {m: {k: self.value(base + f"track_{k}", m) for k in ("forward_us", "overhead_per_forward_us",
                                                                    "overhead_per_piece_us")} for m in ("tiny", "toy_llama")}
        if any(v["forward_us"] is not None for v in cpu.values()):
            self.lines += ["asv, CPU (eager compiler, mode NONE, torch on one thread, host clock): µs.", "",
                           "| model | forward | overhead per forward | per piece |", "|---|---:|---:|---:|"]
            for m, v in cpu.items():
                self.lines.append(f"| {m} | {_fmt(v['forward_us'])} | {_fmt(v['overhead_per_forward_us'])} | "
                                  f"{_fmt(v['overhead_per_piece_us'], 2)} |")
            self.lines.append("")
        else:
            reason = self._skip_reason("host_overhead_cpu", needs_cuda=False)
            self.lines += [f"asv, CPU: not measured here ({reason}).", ""]
            self.unmeasured.append(f"Host overhead, CPU ({reason})")

    # ---- side by side (harness.runtime_breakdown) -------------------------------------------------------------
    SIDE_BY_SIDE = ["compiled call", "plan run", "graph replays", "splitting ops", "FULL", "FULL unsplit", "meta-pcg",
                    "reduce-overhead"]
    UNSPLIT = "FULL unsplit / reduce-overhead"  # FULL with splitting_ops=[]: what a FULL miss is compared with
    SIDE_BY_SIDE_RATIOS = ["PIECEWISE / meta-pcg", "FULL / reduce-overhead", UNSPLIT, "compiled call / plan run"]

    def side_by_side(self) -> None:
        """Tables and target rows from `runtime_breakdown_<commit>.json` files: every variant in one process, timed
        in rotating rounds; each ratio the median of its per-round ratios, with their range."""
        runs = sorted(((name, doc) for name, doc in self.details.items() if name.startswith("runtime_breakdown")),
                      key=lambda item: item[1].get("date", ""))
        if not runs:
            self._not_measured("Side by side, in rotating rounds", self._skip_reason("runtime_breakdown"))
            return
        self.lines += ["## Side by side, in rotating rounds", "",
                       "`python -m pieceworks.harness.runtime_breakdown`: ToyLlama, every variant built in one "
                       "process and timed with CUDA events in rounds whose order rotates (a slow spell of the shared "
                       "host falls on all of them alike); median µs; each ratio is the median of its per-round "
                       "ratios, (min-max) over the rounds. compiled call = PIECEWISE through `CompiledModel`; plan "
                       "run = its replay plan alone; FULL unsplit = FULL with `splitting_ops=[]`. Commit and date in "
                       "each heading (`ci/main.sh` makes one after the asv run on a GPU).", ""]
        found: dict[str, list[str]] = {r: [] for r in self.SIDE_BY_SIDE_RATIOS}  # "commit dtype a/b/c/d (b1/...)"
        missed: dict[str, list[str]] = {r: [] for r in self.SIDE_BY_SIDE_RATIOS}  # "commit dtype bN x (min-max)"
        unsplit_meets: list[bool] = []  # per FULL miss whose row also timed FULL unsplit: did that meet the limit?
        limits = {"PIECEWISE / meta-pcg": TARGETS["piecewise_vs_pcg"], "compiled call / plan run":
                  TARGETS["call_vs_replay"]}

        def ratio_of(row: dict, name: str) -> dict | None:  # runs before the rotating rounds stored bare floats
            value = (row.get("ratios") or {}).get(name)
            return value if isinstance(value, dict) else None

        for name, doc in runs:
            commit = _breakdown_commit(name, doc)
            for dtype, part in (doc.get("dtypes") or {}).items():
                rows = part.get("batches") or {}
                if not rows:
                    self.lines += [f"{dtype} (commit {commit}): no rows ({part.get('crashed') or part.get('errors')})",
                                   ""]
                    continue
                short = {"bfloat16": "bf16", "float32": "fp32"}.get(dtype, dtype)
                shown = [v for v in self.SIDE_BY_SIDE if any(v in r["us"] for r in rows.values())]
                ratios = [r for r in self.SIDE_BY_SIDE_RATIOS if any(ratio_of(x, r) for x in rows.values())]
                self.lines += [f"### {dtype}, commit {commit}, {doc.get('date', '?')} ({doc.get('device', '?')}, "
                               f"torch {doc.get('torch', '?')})", "",
                               "| batch | " + " | ".join(shown + ratios) + " |",
                               "|---:|" + "---:|" * (len(shown) + len(ratios))]
                for batch, row in rows.items():
                    cells = [_fmt(row["us"].get(v, {}).get("median_us"), 1) for v in shown]
                    for r in ratios:
                        ratio = ratio_of(row, r)
                        cells.append(f"{ratio['median']:.3f} ({ratio['min']:.3f}-{ratio['max']:.3f})" if ratio else
                                     "n/a")
                        limit = limits.get(r, TARGETS["full_vs_reduce_overhead"])
                        if ratio and ratio["median"] > limit and r != self.UNSPLIT:
                            miss = f"{commit} {short} b{batch} {ratio['median']:.2f}× ({ratio['min']:.2f}-" \
                                   f"{ratio['max']:.2f})"
                            unsplit = ratio_of(row, self.UNSPLIT)
                            if r == "FULL / reduce-overhead" and unsplit:
                                miss += f", with splitting_ops=[] {unsplit['median']:.2f}×"
                                unsplit_meets.append(unsplit["median"] <= limit)
                            missed[r].append(miss)
                    self.lines.append(f"| {batch} | " + " | ".join(cells) + " |")
                self.lines.append("")
                for r in ratios:
                    values = [(b, ratio_of(x, r)) for b, x in rows.items()]
                    values = [(b, v["median"]) for b, v in values if v]
                    found[r].append(f"{commit} {short} " + "/".join(f"{v:.2f}" for _, v in values)
                                    + "× (b" + "/".join(b for b, _ in values) + ")")
        labels = {"PIECEWISE / meta-pcg": "PIECEWISE ≤ 0.9× Meta pcg, side by side (rounds)",
                  "FULL / reduce-overhead": "FULL ≤ 1.02× reduce-overhead, side by side (rounds)",
                  "FULL unsplit / reduce-overhead": "FULL with splitting_ops=[] next to reduce-overhead, side by "
                                                    "side (rounds; not a target: FULL without the split's cost)",
                  "compiled call / plan run": "CompiledModel call ≤ 1.03× its plan run, side by side (rounds)"}
        for r in self.SIDE_BY_SIDE_RATIOS:
            if not found[r]:
                continue
            if r == self.UNSPLIT:
                self.targets.append((labels[r], ", ".join(found[r]), "reference", ""))
                continue
            note = ""
            if missed[r]:
                note = "misses, with the per-round range: " + "; ".join(missed[r])
                if r == "compiled call / plan run":
                    note += "".join(self._call_profile_note(name, doc) for name, doc in runs)
                if r == "FULL / reduce-overhead" and unsplit_meets and all(unsplit_meets):
                    note += (". Wherever FULL with splitting_ops=[] was timed in the same run, it meets the target at "
                             "the missed batch: the cost is the split's piece boundaries")
            self.targets.append((labels[r], ", ".join(found[r]), _verdict(not missed[r]), note))

    @staticmethod
    def _call_profile_note(name: str, doc: dict) -> str:
        """"; <commit> <dtype> b1 under cProfile (100 calls each ...): call 61 ms vs plan 48 ms, own time the call adds
        per forward: ..."
        for each dtype of one runtime_breakdown run that recorded a `call_profile`."""
        commit = _breakdown_commit(name, doc)
        notes = []
        for dtype, result in (doc.get("dtypes") or {}).items():
            found = result.get("call_profile")
            if not found or not found.get("added"):
                continue
            seconds = found["seconds"]
            notes.append(
                f"; {commit} {dtype} b{found['batch']} under cProfile ({found['calls']} calls each, profiler overhead "
                f"included): call {1e3 * seconds['compiled call']:.0f} ms vs plan {1e3 * seconds['plan run']:.0f} ms, "
                "own time the call adds per forward: " + ", ".join(
                    f"`{a['function']}` {a['us_per_call']:.1f} µs in {a['calls_per_call']:g} calls" for a in found["added"][:5]))
        return "".join(notes)

    def dispatch(self) -> None:
        rows = [(n.split(".")[-1], v.get(())) for n, v in self.asv.items() if n.startswith("dispatch.")]
        if not rows:
            self._not_measured("Dispatch (CPU)", self._skip_reason("dispatch", needs_cuda=False))
            return
        self.lines += ["## Dispatch (CPU, per sweep of 600 batch sizes)", "", "| benchmark | µs |", "|---|---:|"]
        self.lines += [f"| {n} | {_fmt(v and v * 1e6)} |" for n, v in sorted(rows)] + [""]

    def code_size(self) -> None:
        """The project's own check of the reference core's size, from the asv run's `code_size` benchmark."""
        name = "code_size.ReferenceCore.track_lines"
        lines, code = self.value(name, "lines"), self.value(name, "code")
        label = (f"reference core ≤ about {OWN_CHECKS['core_lines']:,} lines (code lines: no blanks, comments, "
                 "docstrings)")
        if code is None:
            self.own_checks.append((label, self._skip_reason("code_size", needs_cuda=False), _verdict(None), ""))
            return
        files = {k: v for k, v in self.details.get("code_size", {}).get("files", {}).items() if k != "total"}
        largest = sorted(files.items(), key=lambda kv: -kv[1]["code"])[:5]
        note = "largest (code lines): " + ", ".join(f"{k} {v['code']}" for k, v in largest) if largest else ""
        within = code <= OWN_CHECKS["core_lines"]
        self.own_checks.append((label, f"{code:,.0f} code lines, {lines:,.0f} in all, {len(files) or '?'} files",
                                "within" if within else "over", "" if within else note))

    def _skip_reason(self, detail: str, needs_cuda: bool = True) -> str:
        """Why `detail`'s benchmark has no numbers: the reason it recorded, else what this machine lacks."""
        recorded = self.details.get(detail, {}).get("skip")
        if recorded:
            return recorded
        if needs_cuda and self.environment.get("device") == "cpu":
            return "needs CUDA: this machine has no CUDA device"
        return "not run on this machine"

    def _not_measured(self, title: str, reason: str) -> None:
        """A section with no numbers: its title and why, never a method text over no table."""
        self.lines += [f"## {title}", "", f"Not measured here ({reason}).", ""]
        self.unmeasured.append(f"{title} ({reason})")

    def _target_not_measured(self, label: str, reason: str) -> None:
        self.targets.append((label, reason, _verdict(None), ""))

    # ---- assembly -------------------------------------------------------------------------------------------
    def render(self, machine: str, pytest_benchmark: dict | None, source: str) -> str:
        """The whole report; `source` names where its result files come from (see `result_files_source`)."""
        self.latency()
        self.memory()
        self.compile()
        self.host_overhead(pytest_benchmark)
        self.side_by_side()
        self.dispatch()
        self.code_size()
        env = self.environment
        head = [f"# Benchmark report: {machine}", "",
                f"Generated by `python -m pieceworks.harness.report` from {source}; no number is edited by hand.", "",
                f"- device: {env.get('device', '?')} (driver {env.get('driver')}, CUDA {env.get('cuda')})",
                f"- torch {env.get('torch')}, Triton {env.get('triton')}, Python {env.get('python')}",
                f"- run: {env.get('date', '?')}, asv machine `{machine}` "
                f"({(self.header.get('params') or {}).get('cpu', '?')}); asv results of {self._commits()}", "",
                "## Targets (ratios from one run; reported, never asserted)", "",
                *self._table(["target", "measured", "verdict", "where the time goes (misses)"], self.targets)]
        own = ["## The project's own checks (goals for its code, not product targets)", "",
               *self._table(["check", "measured", "verdict", "note"], self.own_checks)]
        skips = self._skips()
        tail = ["## Skipped and failed entries", "", *skips, ""] if skips else []
        plots = [f"![{p}](plots/{p})" for p, _ in self.plots]
        return "\n".join(head + self.lines + own + tail + (["## Plots", "", *plots, ""] if plots else []))

    @staticmethod
    def _table(columns: list[str], rows: list[tuple[str, ...]]) -> list[str]:
        return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
                *(f"| {' | '.join(row)} |" for row in rows), ""]

    def _commits(self) -> str:
        """"commit d6f3a658bd3b (code_size, compile), 0f35b6b (latency)": whose numbers each benchmark file shows."""
        modules: dict[str, set[str]] = {}
        for name, commit in sorted(self.header.get("commits", {}).items()):
            modules.setdefault(commit[:12], set()).add(name.split(".")[0])
        return "commit " + ", ".join(f"{c} ({', '.join(sorted(m))})" for c, m in modules.items()) if modules else "?"

    def _skips(self) -> list[str]:
        seen = {}
        for name, doc in self.details.items():
            for key, entry in (doc.get("entries") or {}).items():
                if isinstance(entry, dict) and ("skip" in entry or "error" in entry):
                    impl = key.split("|")[0]
                    seen.setdefault((name, impl), entry.get("skip") or f"ERROR: {entry['error']}")
        return [f"- {name} / {impl}: {why}" for (name, impl), why in sorted(seen.items())]

    def write_plots(self, folder: str) -> list[str]:
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return []
        os.makedirs(folder, exist_ok=True)
        written = []
        for filename, data in self.plots:
            fig, ax = plt.subplots(figsize=(7, 4.5))
            if filename.startswith("latency"):
                title, batches, series = data
                for impl, values in series.items():
                    ax.plot(batches, [math.nan if v is None else v for v in values], marker="o", label=impl)
                ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="µs per forward (median)", title=title)
                ax.set_xticks(batches, [str(b) for b in batches])
                ax.legend(fontsize=7)
            elif filename.startswith("pool"):
                for mode, by_n in data.items():
                    ns = sorted(by_n)
                    ax.plot(ns, [by_n[n]["pool_mib"] or math.nan for n in ns], marker="o", label=f"{mode}, one pool")
                    ax.plot(ns, [by_n[n]["unshared_pool_mib"] or math.nan for n in ns], marker="x", linestyle="--",
                            label=f"{mode}, a pool per size")
                ax.set(xlabel="captured sizes", ylabel="graph pool MiB", title="Graph pool vs captured sizes")
                ax.set_xticks([1, 8, 51])
                ax.legend(fontsize=8)
            else:
                starts = list(data)
                ax.bar(starts, [data[s]["first_call_seconds"] or 0 for s in starts])
                for i, s in enumerate(starts):
                    ax.annotate(f"{_fmt(data[s]['inductor_compiles'], 0)} compiles", (i, data[s]["first_call_seconds"]
                                                                                     or 0), ha="center", va="bottom")
                ax.set(ylabel="first call s", title="Compile: cold / warm / warm on a new host")
            fig.tight_layout()
            path = os.path.join(folder, filename)
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
        return written


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
    parser.add_argument("--commit", default=None,
                        help="asv results of this commit only (default: each benchmark's newest)")
    parser.add_argument("--no-plots", action="store_true", help="REPORT.md only (its plot links stay as they are)")
    args = parser.parse_args(argv)
    asv_dir = os.path.join(args.results, "asv")
    machine = args.machine
    if machine is None:
        machines = sorted((os.path.getmtime(p), os.path.basename(os.path.dirname(p)))
                          for p in glob.glob(os.path.join(asv_dir, "*", "machine.json")))
        if not machines:
            print(f"report: no asv results under {asv_dir}", file=sys.stderr)
            return 1
        machine = machines[-1][1]
    table, header = load_asv(asv_dir, machine, args.commit)
    bench_dir = os.path.join(args.results, "bench", machine)
    details = _details(bench_dir)
    pytest_benchmark = details.pop("host_overhead", None)
    report = Report(table, header, details)
    read = header["files"] + sorted(glob.glob(os.path.join(bench_dir, "*.json")))
    text = report.render(machine, pytest_benchmark, result_files_source(read, args.results))
    os.makedirs(bench_dir, exist_ok=True)
    plots = [] if args.no_plots else report.write_plots(os.path.join(bench_dir, "plots"))
    with open(os.path.join(bench_dir, "REPORT.md"), "w") as f:
        f.write(text)
    print(f"report: wrote {os.path.join(bench_dir, 'REPORT.md')} and {len(plots)} plots")
    for section in report.unmeasured:
        print(f"report: not measured here: {section}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
