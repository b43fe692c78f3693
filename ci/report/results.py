"""The result files of one machine's run, read once (`load_results`), and whether git tracks them unmodified
(`result_files_source`)."""

from __future__ import annotations

import ast
import dataclasses
import datetime
import glob
import json
import os
import subprocess
from typing import Any

from pieceworks.gate.results import ResultSetError, is_number, newest_runs, result_files, values_of
from pieceworks.gate.thresholds import DEFAULT_PATH

NEWEST = ("runtime_breakdown",)  # `<kind>_<label>.json` runs: only the newest of each kind is read


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
    elsewhere: dict[str, str]  # {details name: another machine that measured it at this commit}

    def value(self, name: str, *key: Any) -> Any:
        return self.asv.get(name, {}).get(tuple(key))

    def limit(self, key: str) -> float:
        return self.targets[key]["limit"]

    def label(self, key: str, field: str = "label", **extra: str) -> str:
        return self.targets[key][field].format(limit=self.limit(key), **extra)

    def skip_reason(self, detail: str, needs_cuda: bool = True) -> str:
        """Why `detail`'s benchmark has no numbers: the reason it recorded (and the other machine that
        measured it at this commit, where one did: a 2-GPU benchmark's run), else what this machine lacks."""
        if self.details.get(detail, {}).get("skip"):
            where = self.elsewhere.get(detail)
            return self.details[detail]["skip"] + (
                f"; measured at this commit on `{where}`: [its report](../{where}/REPORT.md)" if where else ""
            )
        if needs_cuda and self.environment.get("device") == "cpu":
            return "needs CUDA: this machine has no CUDA device"
        return f"not run at commit {self.commit[:12]} on this machine"


def newest(details: dict[str, Any], kind: str) -> dict | None:
    """Removes every `<kind>_<label>` run from `details` and returns the newest by its recorded date (then
    label), its "commit" defaulting to the label; None where there is none."""
    runs = {
        name[len(kind) + 1 :]: details.pop(name) for name in sorted(details) if name.startswith(kind + "_")
    }
    label = max(runs, key=lambda found: (str(runs[found].get("date", "")), found), default=None)
    return None if label is None else {"commit": label, **runs[label]}


def recorded_run(doc: dict[str, Any]) -> tuple[str, str]:
    """(commit, date) a details file records ("" where it records none): the suites' in their environment, the
    runtime breakdown at its top, pytest-benchmark's in its commit_info."""
    environment = doc.get("environment")
    where = environment if isinstance(environment, dict) and "commit" in environment else doc
    commit = where.get("commit") or (doc.get("commit_info") or {}).get("id") or ""
    return str(commit), str(where.get("date") or doc.get("datetime") or "")


def load_results(
    results: str, machine: str, commit: str | None = None, targets: str = DEFAULT_PATH
) -> Results:
    """One run of `machine`: the asv results (`results`/asv/`machine`) and details files
    (`results`/bench/`machine`, of each NEWEST kind the newest, under the kind's name) of `commit`, by default
    the newest commit measured there (by the dates the details files and asv's runs record); files of other
    commits, or recording none, are left out and counted in `others`. Also the thresholds file `targets`.
    ResultSetError where that commit has no result files."""
    try:
        files = result_files(os.path.join(results, "asv", machine))
    except ResultSetError:
        files = []
    details: dict[str, Any] = {}
    for path in (bench := sorted(glob.glob(os.path.join(results, "bench", machine, "*.json")))):
        with open(path) as f:
            details[os.path.splitext(os.path.basename(path))[0]] = json.load(f)
    recorded = {name: recorded_run(doc) for name, doc in details.items()}  # {name: (commit, date)}
    if commit is None:
        started = [
            (
                datetime.datetime.fromtimestamp(run[0] / 1e3, datetime.UTC).isoformat(timespec="seconds"),
                run[2]["commit_hash"],
            )
            for run in (newest_runs(files) if files else {}).values()
        ]
        commit = max([(d, c) for c, d in recorded.values() if c] + started, default=(None, None))[1]
    ours = [f for f in files if commit and os.path.basename(f).startswith(commit[:8])]
    mine = {name for name, (c, _) in recorded.items() if commit and len(c) >= 7 and c[:7] == commit[:7]}
    if not commit or (not ours and not mine):
        raise ResultSetError(
            f"{results}: no result files of machine {machine}" + (f" and commit {commit}" if commit else "")
        )
    runs = newest_runs(ours) if ours else {}
    asv = {
        name: {
            tuple(map(ast.literal_eval, combo)): v if is_number(v) else None
            for combo, v, _ in values_of(path, doc, name)
        }
        for name, (_, path, doc) in runs.items()
    }
    details = {name: doc for name, doc in details.items() if name in mine}
    details.update({kind: doc for kind in NEWEST if (doc := newest(details, kind)) is not None})
    with open(targets, encoding="utf-8") as f:
        table = json.load(f)
    environment: dict[str, Any] = details.get("environment") or next(
        (d for d in details.values() if "environment" in d), {}
    )
    return Results(
        asv,
        commit,
        details,
        details.pop("host_overhead", {}),
        ours + [p for p in bench if os.path.splitext(os.path.basename(p))[0] in mine],
        len(files) - len(ours) + len(recorded) - len(mine),
        {**table["targets"], **table["own_checks"]},
        environment.get("environment", {}),
        measured_elsewhere(results, machine, commit),
    )


def measured_elsewhere(results: str, machine: str, commit: str) -> dict[str, str]:
    """{details file name: machine} for the details files of `commit` that other machines under `results`
    recorded with numbers (no skip), the first machine by name where several did."""
    found: dict[str, str] = {}
    for path in sorted(glob.glob(os.path.join(results, "bench", "*", "*.json"))):
        if (other := os.path.basename(os.path.dirname(path))) == machine:
            continue  # this machine's files: load_results read them
        with open(path) as f:
            doc = json.load(f)
        if recorded_run(doc)[0][:7] == commit[:7] and not doc.get("skip"):
            found.setdefault(os.path.splitext(os.path.basename(path))[0], other)
    return found


def result_files_source(paths: list[str], results: str) -> str:
    """ "the committed result files" where git tracks every one of `paths` unmodified, else "the result files
    in `<results>`" (also where git is missing or `results` lies outside a repository)."""
    try:
        status = subprocess.run(
            [
                "git",
                "-C",
                results,
                "status",
                "--porcelain",
                "--ignored",
                "--untracked-files=all",
                "--",
                *map(os.path.abspath, paths),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        committed = status.returncode == 0 and not status.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        committed = False
    return "the committed result files" if committed else f"the result files in `{results}`"
