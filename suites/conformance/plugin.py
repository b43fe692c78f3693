"""The conformance suite's pytest plugin: its options, one result per test, the summary, the JSON.

Load it before pytest reads the arguments: `pytest -p pieceworks.conformance.plugin --pyargs
pieceworks.conformance` (the suite's conftest also lists it, for `pytest path/to/conformance`); it loads
`pieceworks.harness.testing.pytest_plugin` (the `gpu` marker and timeouts) too, and registers the hypothesis
profiles. When collection starts it resolves the run from the options (`run.resolve`: a usage error is
reported once) and prints its seed and capture sizes in the header. Each conformance test carries the user
property "conformance" ({impl, model, property}); the plugin folds each such test's reports into one result
(pass, fail, error, n/a, unavailable, skipped, with the reason: for a failure the assertion's first line,
which names the batches served; and the failure's example), prints a summary naming every reason a test did
not run, writes all results as JSON to `--conformance-json PATH` (`python -m pieceworks.conformance.table
PATH` makes the table), and fails a run in which no test ran.
"""

from __future__ import annotations

import collections
import datetime
import json
import os
import pathlib
import platform
import re
import sys
from typing import Any

import pytest

from pieceworks.harness.testing.strategies import register_profiles

from .plan import DEFAULT_MAX_COUNT, DEFAULT_MAX_SIZE

pytest_plugins = ["pieceworks.harness.testing.pytest_plugin"]
register_profiles()

CONFORMANCE_KEY = "conformance"  # the user property a conformance test carries: {"impl", "model", "property"}
# What the conformance suite's conftest tells the plugin about the run (implementations, models, device), for
# the JSON.
CONFORMANCE_META = pytest.StashKey[dict]()
_RESULTS = pytest.StashKey[dict]()
_ACTIVE: list[pytest.Config] = []  # configs of the sessions running in this process (pytester nests them)
_RANK = {"pass": 0, "n/a": 1, "unavailable": 1, "skipped": 1, "fail": 2, "error": 3}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pieceworks conformance", "the conformance suite (pieceworks.conformance)")
    group.addoption(
        "--impl",
        action="append",
        default=[],
        metavar="NAME",
        help="a registered implementation, package.module:Adapter or path/to/file.py:Adapter (repeatable; "
        "default: every registered one)",
    )
    group.addoption(
        "--conformance-model",
        action="append",
        default=[],
        metavar="NAME|PATH",
        help="model to test, or the path of a Hugging Face config.json (repeatable; default: silly, "
        "silly-inplace, toy-llama, toy-llama-bf16, hf-llama, llama; 'all': every model)",
    )
    group.addoption(
        "--conformance-device",
        choices=["auto", "cuda", "cpu"],
        default="auto",
        help="cuda: every property, as gpu tests; cpu: those that need no CUDA graph; auto (default): "
        "cuda where this machine has CUDA, else cpu",
    )
    group.addoption(
        "--conformance-max-size",
        type=int,
        default=DEFAULT_MAX_SIZE,
        metavar="N",
        help=f"the largest capture size a run may draw (default {DEFAULT_MAX_SIZE}; the largest size is "
        "drawn from 8..N); the seed is --hypothesis-seed",
    )
    group.addoption(
        "--conformance-sizes",
        type=int,
        default=DEFAULT_MAX_COUNT,
        metavar="N",
        help=f"at most N capture sizes per run (default {DEFAULT_MAX_COUNT})",
    )
    group.addoption(
        "--conformance-json", default=None, metavar="PATH", help="write every result as JSON here"
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "conformance(property): a property of the conformance suite, by its table name"
    )
    config.stash[_RESULTS] = {}
    _ACTIVE.append(config)
    config.add_cleanup(lambda: _ACTIVE.remove(config))


def pytest_collection(session: pytest.Session) -> None:
    from .run import resolve  # imports torch and the adapters: only once a run starts

    resolve(session.config)


def pytest_report_header(config: pytest.Config) -> list[str]:
    from .run import resolve

    try:
        return [f"pieceworks conformance: {resolve(config).plan.describe()}"]
    except pytest.UsageError:
        return []  # reported once, when collection starts


def failure_example(text: str, skip: tuple[str, ...] = (), limit: int = 1500) -> str:
    """What a failure's report says about reproducing it: the assertion's message, hypothesis' falsifying (or
    failing explicit) example without the arguments named in `skip` (fixtures, whose reprs are long and not
    drawn), each argument on one line, and its seed or reproduce_failure blob; at most `limit` characters."""
    lines = [line[1:] for line in text.splitlines() if line.startswith("E ")]
    start = next(
        (i for i, line in enumerate(lines) if re.match(r"\s*(Falsifying|Failing explicit) example", line)),
        len(lines),
    )
    keep = [line.strip() for line in lines[:start] if line.strip()][:6]
    if start < len(lines):
        header = lines[start]
        indent = len(header) - len(header.lstrip())
        keep.append(header.strip())
        kept = False  # whether the argument being printed is kept (its continuation lines join its line)
        for line in lines[start + 1 :]:
            depth = len(line) - len(line.lstrip())
            if line.strip() == ")" and depth == indent:
                keep.append(")")
                break
            match = re.match(r"\s*(\w+)=", line)
            if match and depth == indent + 4:
                kept = match.group(1) not in skip
                if kept:
                    keep.append("    " + line.strip())
            elif kept and depth > indent + 4:
                keep[-1] += " " + line.strip()
    keep.extend(
        line.strip()
        for line in text.splitlines()
        if re.search(r"reproduce_failure\(|@seed\(|--hypothesis-seed", line) and line.strip() not in keep
    )
    return "\n".join(keep)[:limit]


def _outcome(report: pytest.TestReport) -> tuple[str, str | None, str | None]:
    """(outcome, reason, example) of one phase's report."""
    if report.skipped:
        longrepr = report.longrepr
        text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reason = text.removeprefix("Skipped: ").strip()
        for prefix, outcome in (("not applicable:", "n/a"), ("unavailable:", "unavailable")):
            if reason.startswith(prefix):
                return outcome, reason[len(prefix) :].strip(), None
        return "skipped", reason, None
    if report.failed:
        text = report.longreprtext
        kind = "fail" if report.when == "call" else "error"
        skip = tuple(dict[str, Any](report.user_properties).get(CONFORMANCE_KEY, {}).get("fixtures", ()))
        return kind, f"{report.when}: {first_line(report)}"[:300], failure_example(text, skip)
    return "pass", None, None


def first_line(report: pytest.TestReport) -> str:
    """The first line of a failed report's exception message (an AssertionError's without its type name)."""
    crash = getattr(report.longrepr, "reprcrash", None)
    message = (
        crash.message
        if crash is not None
        else next(
            (line[1:].strip() for line in report.longreprtext.splitlines() if line.startswith("E ")), ""
        )
    )
    line = next((line.strip() for line in message.splitlines() if line.strip()), "")
    quoted = re.match(r"\w+\((['\"])(.*)", line)  # an exception group's: the repr of its first exception
    if quoted:
        line = quoted.group(2).split("\\n")[0]
    return line.removeprefix("AssertionError: ")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Fold each phase of a conformance test into its one result: the worst outcome wins; seconds add up (a
    build in a fixture's setup included)."""
    props = dict[str, Any](report.user_properties).get(CONFORMANCE_KEY)
    if props is None or not _ACTIVE:
        return
    results = _ACTIVE[-1].stash[_RESULTS]
    props = {k: v for k, v in props.items() if k != "fixtures"}
    entry = results.setdefault(
        report.nodeid,
        {**props, "outcome": None, "reason": None, "example": None, "seconds": 0.0, "nodeid": report.nodeid},
    )
    entry["seconds"] = round(entry["seconds"] + report.duration, 3)
    if report.passed and report.when != "call":
        return
    outcome, reason, example = _outcome(report)
    if outcome == "fail":
        from .run import resolve

        example = f"{example}\nreplay: --hypothesis-seed {resolve(_ACTIVE[-1]).plan.seed}".lstrip()
    if entry["outcome"] is None or _RANK[outcome] > _RANK[entry["outcome"]]:
        entry.update(outcome=outcome, reason=reason, example=example)


def conformance_results(config: pytest.Config) -> list[dict]:
    """The conformance results of this pytest run so far, one per test, in the order they ran (a test that
    never reported an outcome, e.g. one cut short, counts as an error)."""
    results = [dict(r) for r in config.stash.get(_RESULTS, {}).values()]
    for r in results:
        if r["outcome"] is None:
            r.update(outcome="error", reason="the test reported no outcome (interrupted?)")
    return results


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    results = conformance_results(config)
    if not results:
        return
    counts = collections.Counter(r["outcome"] for r in results)
    tr = terminalreporter
    tr.section("pieceworks conformance")
    from .run import resolve

    tr.line(resolve(config).plan.describe())
    tr.line(", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: _RANK[kv[0]])))
    reasons: dict[tuple[str, str], list[str]] = {}
    for r in results:
        if r["outcome"] in ("n/a", "unavailable", "skipped"):
            where = f"{r['impl']}/{r['model']}/{r['property']}"
            reasons.setdefault((r["outcome"], r["reason"] or ""), []).append(where)
    for (outcome, reason), wheres in sorted(reasons.items()):
        shown = ", ".join(wheres[:4]) + (f" and {len(wheres) - 4} more" if len(wheres) > 4 else "")
        tr.line(f"{outcome}: {reason} [{shown}]")
    for r in results:
        if r["outcome"] in ("fail", "error"):
            tr.line(f"{r['outcome'].upper()}: {r['impl']}/{r['model']}/{r['property']}: {r['reason']}")
    path = config.getoption("--conformance-json", default=None)
    if path:
        tr.line(f"results written to {path}; table: python -m pieceworks.conformance.table {path}")
    if nothing_ran(results):
        tr.line(f"FAIL: {nothing_ran(results)}", red=True)


def nothing_ran(results: list[dict]) -> str | None:
    """Why a conformance run tested nothing (every result n/a, unavailable or skipped), else None."""
    if not results or any(r["outcome"] in ("pass", "fail", "error") for r in results):
        return None
    reasons = sorted({r["reason"] or r["outcome"] for r in results})
    return (
        f"pieceworks conformance: none of {len(results)} tests ran (each was n/a, unavailable or skipped), "
        f"so nothing was tested; reasons: {'; '.join(reasons[:3])}" + (" ..." if len(reasons) > 3 else "")
    )


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    reason = nothing_ran(conformance_results(config))
    if reason and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    path = config.getoption("--conformance-json", default=None)
    if not path:
        return
    document = {
        "schema": 1,
        "created": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "argv": [os.path.basename(sys.argv[0]), *sys.argv[1:]],
        "python": platform.python_version(),
        "meta": config.stash.get(CONFORMANCE_META, {}),
        "results": conformance_results(config),
    }
    pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(path).write_text(json.dumps(document, indent=1) + "\n")
