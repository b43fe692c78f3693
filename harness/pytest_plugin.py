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
  exports it as `PIECEWORKS_MUTANT`, so that cases run in a subprocess (`scenario.run_case`) apply it too.
"""

from __future__ import annotations

import faulthandler
import importlib.util
import signal
import sys
import threading
from collections.abc import Iterator

import pytest

GPU_TIMEOUT_S = 120.0
_GRACE_S = 30.0
_HAS_PYTEST_TIMEOUT = importlib.util.find_spec("pytest_timeout") is not None


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--pieceworks-mutant", default=None,
                     help="run the suites against a deliberately broken reference (see pieceworks.harness.mutants)")
    parser.addoption("--pieceworks-gpu-timeout", type=float, default=GPU_TIMEOUT_S,
                     help=f"seconds a gpu test may take unless it is marked timeout(s) (default {GPU_TIMEOUT_S:g})")
    if not _HAS_PYTEST_TIMEOUT:  # pytest-timeout's own ini option, so that configs naming it stay valid without it
        parser.addini("timeout", "seconds a test may take (enforced by pieceworks' fallback: pytest-timeout absent)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (run with -m gpu on a GPU runner)")
    if not config.pluginmanager.hasplugin("timeout"):
        config.addinivalue_line("markers", "timeout(seconds): fail the test after this many seconds")
    name = config.getoption("--pieceworks-mutant", default=None)
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
