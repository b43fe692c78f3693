"""pytest plugin (entry point `pytest11: pieceworks`): the `gpu` marker and its skip rule, timeouts, mutants.

- **gpu.** A test marked `@pytest.mark.gpu` is skipped with the reason spelled out when CUDA is absent, so `pytest`
  on a CPU machine stays green for the right reason and `pytest -m gpu` on a GPU runner runs them. Importing this
  module does not import torch; the check runs once, at collection, and only when a gpu test was collected.
- **Never hang.** Every gpu test gets a timeout: its own `@pytest.mark.timeout(s)`, else `--pieceworks-gpu-timeout`
  (default 120 s). pytest-timeout enforces timeouts when it is installed (the `test` extra has it). Without it this
  plugin enforces them itself, with one warning saying so: a SIGALRM fails the test where it stands (POSIX, main
  thread), and if the alarm cannot interrupt it (a call stuck in C, e.g. a CUDA synchronize on a hung kernel),
  faulthandler prints every thread's stack and ends the process 30 s later: a verdict, never a hang. The ini option
  `timeout` (all tests) and the `timeout` marker work in both cases.
- **Mutants.** `--pieceworks-mutant NAME` applies mutant NAME (pieceworks.harness.mutants) for the session and
  exports it as `PIECEWORKS_MUTANT`, so that cases run in a subprocess (`scenario.run_case`, a child pytest) apply
  it too.
- **Conformance** (`pytest --pyargs pieceworks.conformance`). Its options live here, in the always-loaded plugin,
  because options of a conftest below the root are not reliably registered under `--pyargs`: `--impl NAME` (or
  `package.module:Adapter`, `path/to/file.py:Adapter`; repeatable; default every registered implementation),
  `--conformance-model NAME` (repeatable; default silly, toy-llama, hf-llama; `all`: every model),
  `--conformance-device auto|cuda|cpu` (auto, the default: cuda where the machine has CUDA, else cpu, which runs
  the properties that need no CUDA graph),
  `--conformance-json PATH`. Each conformance test
  carries the user property "conformance" ({impl, model, property}); the plugin turns every such test's reports into
  one result (pass, fail, error, n/a, unavailable, skipped, with the reason and a failure's example), prints a
  summary listing every not-applicable reason (never a silent skip), and writes them all as JSON to PATH, which
  `python -m pieceworks.harness.conformance_table PATH` turns into the conformance table.
"""

from __future__ import annotations

import datetime
import faulthandler
import importlib.util
import json
import os
import platform
import re
import signal
import sys
import threading
from collections.abc import Iterator

import pytest

GPU_TIMEOUT_S = 120.0
CONFORMANCE_KEY = "conformance"  # the user property a conformance test carries: {"impl", "model", "property"}
# What the conformance suite's conftest tells the plugin about the run (implementations, models, device), for the JSON.
CONFORMANCE_META = pytest.StashKey[dict]()
_RESULTS = pytest.StashKey[dict]()
_ACTIVE: list[pytest.Config] = []  # configs of the sessions running in this process (pytester nests them)
_GRACE_S = 30.0
_HAS_PYTEST_TIMEOUT = importlib.util.find_spec("pytest_timeout") is not None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--pieceworks-mutant", default=None,
                     help="run the suites against a deliberately broken reference (see pieceworks.harness.mutants)")
    parser.addoption("--pieceworks-gpu-timeout", type=float, default=GPU_TIMEOUT_S,
                     help=f"seconds a gpu test may take unless it is marked timeout(s) (default {GPU_TIMEOUT_S:g})")
    group = parser.getgroup("pieceworks conformance", "the conformance suite (pytest --pyargs pieceworks.conformance)")
    group.addoption("--impl", action="append", default=[], metavar="NAME",
                    help="implementation to test: a registered name, package.module:Adapter or path/to/file.py:Adapter"
                         " (repeatable; default: every registered implementation)")
    group.addoption("--conformance-model", action="append", default=[], metavar="NAME",
                    help="model to test (repeatable; default: silly, toy-llama, hf-llama; 'all': every model of "
                         "the suite)")
    group.addoption("--conformance-device", choices=["auto", "cuda", "cpu"], default="auto",
                    help="cuda: every property, as GPU tests; cpu: the properties that need no CUDA graph, on the "
                         "CPU; auto (default): cuda when this machine has a CUDA device, else cpu")
    group.addoption("--conformance-json", default=None, metavar="PATH",
                    help="write every conformance result as JSON here (python -m pieceworks.harness.conformance_table)")
    if not _HAS_PYTEST_TIMEOUT:  # pytest-timeout's own ini option, so that configs naming it stay valid without it
        parser.addini("timeout", "seconds a test may take (enforced by pieceworks' fallback: pytest-timeout absent)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (run with -m gpu on a GPU runner)")
    config.addinivalue_line("markers", "conformance(property): a property of the conformance suite, by its table name")
    config.stash[_RESULTS] = {}
    _ACTIVE.append(config)
    config.add_cleanup(lambda: _ACTIVE.remove(config))
    if not config.pluginmanager.hasplugin("timeout"):
        config.addinivalue_line("markers", "timeout(seconds): fail the test after this many seconds")
    name = config.getoption("--pieceworks-mutant", default=None) or os.environ.get("PIECEWORKS_MUTANT")
    if name:
        from .mutants import apply

        patch = pytest.MonkeyPatch()
        description = apply(name, patch)
        patch.setenv("PIECEWORKS_MUTANT", name)
        config.add_cleanup(patch.undo)
        config.issue_config_time_warning(pytest.PytestWarning(f"pieceworks mutant {name}: {description}"), 2)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    default = config.getoption("--pieceworks-gpu-timeout")
    for item in gpu_items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(default))
    import torch

    if torch.cuda.is_available():
        if not config.pluginmanager.hasplugin("timeout"):
            config.issue_config_time_warning(pytest.PytestWarning(
                "pytest-timeout is not installed: pieceworks enforces gpu test timeouts with SIGALRM and "
                "faulthandler instead. Fix: pip install pytest-timeout (in the `test` extra)"), 2)
        return
    skip = pytest.mark.skip(
        reason=f"needs CUDA: torch {torch.__version__} sees no CUDA device here; run `pytest -m gpu` on a GPU runner"
    )
    for item in gpu_items:
        item.add_marker(skip)


def _timeout_of(item: pytest.Item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
    else:
        value = item.config.getini("timeout") if not _HAS_PYTEST_TIMEOUT else None
    try:
        return float(value) if value not in (None, "") else 0.0
    except (TypeError, ValueError):
        return 0.0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """The fallback timeout, only where pytest-timeout is not active."""
    seconds = 0.0
    if not item.config.pluginmanager.hasplugin("timeout"):
        seconds = _timeout_of(item)
    usable = seconds > 0 and hasattr(signal, "SIGALRM") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def expired(signum: int, frame: object) -> None:
        pytest.fail(f"Timeout: the test ran past its {seconds:g} s limit (pieceworks fallback timeout)",
                    pytrace=True)

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    faulthandler.dump_traceback_later(seconds + _GRACE_S, exit=True, file=sys.stderr)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        faulthandler.cancel_dump_traceback_later()


# ---- conformance results --------------------------------------------------------------------------------------
_RANK = {"pass": 0, "n/a": 1, "unavailable": 1, "skipped": 1, "fail": 2, "error": 3}


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ").strip()


def failure_example(text: str, skip: tuple[str, ...] = (), limit: int = 1500) -> str:
    """What a failure's report says about reproducing it: the assertion's message, hypothesis' falsifying (or failing
    explicit) example without the arguments named in `skip` (fixtures, whose reprs are long and not drawn), and its
    seed or reproduce_failure blob; at most `limit` characters."""
    lines = [line[1:] for line in text.splitlines() if line.startswith("E ")]
    start = next((i for i, line in enumerate(lines)
                  if re.match(r"\s*(Falsifying|Failing explicit) example", line)), len(lines))
    keep = [line.strip() for line in lines[:start] if line.strip()][:6]
    if start < len(lines):
        header = lines[start]
        indent = len(header) - len(header.lstrip())
        keep.append(header.strip())
        for line in lines[start + 1:]:
            if line.strip() == ")" and len(line) - len(line.lstrip()) == indent:
                keep.append(")")
                break
            match = re.match(r"\s*(\w+)=", line)
            if match and len(line) - len(line.lstrip()) == indent + 4 and match.group(1) not in skip:
                keep.append("    " + line.strip())
    keep.extend(line.strip() for line in text.splitlines()
                if re.search(r"reproduce_failure\(|@seed\(|--hypothesis-seed", line) and line.strip() not in keep)
    return "\n".join(keep)[:limit]


def _outcome(report: pytest.TestReport) -> tuple[str, str | None, str | None]:
    """(outcome, reason, example) of one phase's report."""
    if report.skipped:
        reason = _skip_reason(report)
        for prefix, outcome in (("not applicable:", "n/a"), ("unavailable:", "unavailable")):
            if reason.startswith(prefix):
                return outcome, reason[len(prefix):].strip(), None
        return "skipped", reason, None
    if report.failed:
        text = report.longreprtext
        kind = "fail" if report.when == "call" else "error"
        last = next((line[1:].strip() for line in reversed(text.splitlines()) if line.startswith("E ")), "")
        skip = tuple(dict(report.user_properties).get(CONFORMANCE_KEY, {}).get("fixtures", ()))
        return kind, f"{report.when}: {last}"[:300], failure_example(text, skip)
    return "pass", None, None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Fold each phase of a conformance test into its one result: the worst outcome wins; seconds add up (a build in
    a fixture's setup included)."""
    props = dict(report.user_properties).get(CONFORMANCE_KEY)
    if props is None or not _ACTIVE:
        return
    results = _ACTIVE[-1].stash[_RESULTS]
    props = {k: v for k, v in props.items() if k != "fixtures"}
    entry = results.setdefault(report.nodeid, {**props, "outcome": None, "reason": None, "example": None,
                                                "seconds": 0.0, "nodeid": report.nodeid})
    entry["seconds"] = round(entry["seconds"] + report.duration, 3)
    if report.passed and report.when != "call":
        return
    outcome, reason, example = _outcome(report)
    if entry["outcome"] is None or _RANK[outcome] > _RANK[entry["outcome"]]:
        entry.update(outcome=outcome, reason=reason, example=example)


def conformance_results(config: pytest.Config) -> list[dict]:
    """The conformance results of this pytest run so far, one per test, in the order they ran (a test that never
    reported an outcome, e.g. one cut short, counts as an error)."""
    results = [dict(r) for r in config.stash.get(_RESULTS, {}).values()]
    for r in results:
        if r["outcome"] is None:
            r.update(outcome="error", reason="the test reported no outcome (interrupted?)")
    return results


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    results = conformance_results(config)
    if not results:
        return
    counts: dict[str, int] = {}
    for r in results:
        counts[r["outcome"]] = counts.get(r["outcome"], 0) + 1
    tr = terminalreporter
    tr.section("pieceworks conformance")
    tr.line(", ".join(f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: _RANK[kv[0]])))
    reasons: dict[tuple[str, str], list[str]] = {}
    for r in results:
        if r["outcome"] in ("n/a", "unavailable", "skipped"):
            reasons.setdefault((r["outcome"], r["reason"] or ""), []).append(f"{r['impl']}/{r['model']}/{r['property']}")
    for (outcome, reason), where in sorted(reasons.items()):
        shown = ", ".join(where[:4]) + (f" and {len(where) - 4} more" if len(where) > 4 else "")
        tr.line(f"{outcome}: {reason} [{shown}]")
    for r in results:
        if r["outcome"] in ("fail", "error"):
            tr.line(f"{r['outcome'].upper()}: {r['impl']}/{r['model']}/{r['property']}: {r['reason']}")
    path = config.getoption("--conformance-json", default=None)
    if path:
        tr.line(f"results written to {path}; table: python -m pieceworks.harness.conformance_table {path}")
    if nothing_ran(results):
        tr.line(f"FAIL: {nothing_ran(results)}", red=True)


def nothing_ran(results: list[dict]) -> str | None:
    """Why a conformance run tested nothing (every result n/a, unavailable or skipped), else None."""
    if not results or any(r["outcome"] in ("pass", "fail", "error") for r in results):
        return None
    reasons = sorted({r["reason"] or r["outcome"] for r in results})
    return (f"pieceworks conformance: none of {len(results)} tests ran (each was n/a, unavailable or skipped), so "
            f"nothing was tested; reasons: {'; '.join(reasons[:3])}" + (" ..." if len(reasons) > 3 else ""))


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
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "argv": [os.path.basename(sys.argv[0]), *sys.argv[1:]],
        "python": platform.python_version(),
        "meta": config.stash.get(CONFORMANCE_META, {}),
        "results": conformance_results(config),
    }
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(document, f, indent=1, sort_keys=False)
        f.write("\n")
    os.replace(tmp, path)
