"""Shared fixtures: every test runs without autograd, with a fresh Dynamo and its own pieceworks cache."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from pieceworks.harness.measure import provenance
from pieceworks.harness.testing.strategies import register_profiles

# The repository root on sys.path, so that `suites.mutants` imports whatever the pytest run's root (a --pyargs
# run of the conformance suite from another folder loads this file too).
_REPO = str(Path(__file__).resolve().parent.parent)
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)
# The gpu marker and timeouts; --pieceworks-mutant.
pytest_plugins = ["pieceworks.harness.testing.pytest_plugin", "suites.mutants.plugin"]
register_profiles()

# The conformance suite runs on its own (`pytest -p pieceworks.conformance.plugin --pyargs
# pieceworks.conformance`, or `pytest suites/conformance`): it builds every implementation x model and would
# take minutes of `pytest suites -m gpu`, whose own GPU tests cover pieceworks. Its CPU tests
# (suites/test_conformance_*.py) run with the rest.
collect_ignore = ["conformance"]

# One Inductor cache for the whole session, never a developer's ~/.cache or a previous run's leftovers;
# removed when pytest's process exits. Assigned, not setdefault: importing torch already sets it (to the
# machine-wide /tmp/torchinductor_<user>).
_INDUCTOR_CACHE = tempfile.TemporaryDirectory(prefix="pieceworks-tests-inductor-", ignore_cleanup_errors=True)
os.environ["TORCHINDUCTOR_CACHE_DIR"] = _INDUCTOR_CACHE.name


@pytest.fixture(autouse=True)
def fresh_dynamo_and_cache(tmp_path, monkeypatch):
    torch._dynamo.reset()
    monkeypatch.setenv("PIECEWORKS_CACHE_DIR", str(tmp_path / "pieceworks-cache"))
    monkeypatch.delenv("PIECEWORKS_DISABLE_CACHE", raising=False)
    with torch.no_grad():  # pieceworks is for inference; the toy models mutate views in place
        yield
    torch._dynamo.reset()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`slow` tests are opt-in: they run where `-m` names them (`-m slow`) or the command line names the test
    itself (`pytest suites/test_cache.py::test_x`, as a mutant's run does), and are deselected (counted in
    pytest's summary) otherwise."""
    if "slow" not in (config.option.markexpr or ""):
        named = set(config.args)
        slow = [
            item
            for item in items
            if item.get_closest_marker("slow") and not {item.nodeid, item.nodeid.split("[")[0]} & named
        ]
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if item not in slow]


_SWEEP_TEST = "test_every_try_of_the_new_user_sweep_is_served_right_or_refused_by_name"
_SWEEP = pytest.StashKey[tuple]()  # (the process, its stdout file, its stderr file)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The new-user sweep (suites/new_user_sweep.py, 1.5 minutes of compiles) starts in a process of its own
    once collection selected its test: it runs beside the suite, on the machine's other core, and the test
    (`new_user_sweep` fixture) waits for it; pytest's exit kills it where the test did not run."""
    if any(getattr(item, "originalname", None) == _SWEEP_TEST for item in session.items):
        out, err = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")  # a full pipe would stall it
        command = [sys.executable, "-m", "suites.new_user_sweep"]
        session.config.stash[_SWEEP] = (
            subprocess.Popen(command, cwd=_REPO, stdout=out, stderr=err),
            out,
            err,
        )


def pytest_sessionfinish(session: pytest.Session) -> None:
    if (sweep := session.config.stash.get(_SWEEP, None)) is not None:
        sweep[0].kill()


@pytest.hookimpl(optionalhook=True)  # pytest-benchmark's hook: absent where it is not installed
def pytest_benchmark_update_json(config: pytest.Config, benchmarks: list, output_json: dict) -> None:
    """`--benchmark-json` records the measured code's commit (`provenance.code_commit`, as every details file
    does), not only git's HEAD in its `commit_info`: the report reads a run by the commit it measured."""
    output_json["commit"] = provenance.code_commit()


@pytest.fixture
def new_user_sweep(request: pytest.FixtureRequest) -> subprocess.CompletedProcess:
    """The new-user sweep's process, finished: its exit status, stdout and stderr."""
    proc, out, err = request.config.stash[_SWEEP]
    proc.wait(timeout=600)
    texts = [(file.seek(0), file.read())[1] for file in (out, err)]
    return subprocess.CompletedProcess(proc.args, proc.returncode, *texts)


@pytest.fixture
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA: no CUDA device visible to torch")
    return torch.device("cuda")


class EarlyProcesses:
    """Child processes that slow tests of one module wait on, started when the module starts: they run beside
    the module's in-process tests (and beside each other) on the machine's other core instead of one after
    another.

    `start(test, args, env=..., cwd=...)` starts one for `test` (a test function of the module), only when the
    pytest run includes that test (`selected(test)`). The test takes what its processes did with
    `results(test)`: a `CompletedProcess` per process, in the order started, stdout and stderr as text
    (written to files, so that a chatty child never blocks on a full pipe). Each process has `timeout` seconds
    from its start; one still running then is killed and fails the test. Processes no test took are killed
    when the module ends.
    """

    def __init__(self, request: pytest.FixtureRequest, folder: Path) -> None:
        self._selected = {
            item.originalname
            for item in request.session.items
            if getattr(item, "module", None) is request.module
        }
        self._folder = folder
        self._running: dict[str, list] = {}

    def selected(self, test) -> bool:
        """Whether the pytest run includes `test`."""
        return test.__name__ in self._selected

    def start(
        self,
        test,
        args: list[str],
        *,
        env: dict[str, str] | None = None,
        cwd: str | os.PathLike | None = None,
        timeout: float = 600,
    ) -> None:
        if not self.selected(test):
            return
        started = self._running.setdefault(test.__name__, [])
        name = self._folder / f"{test.__name__}-{len(started)}"
        out, err = (open(f"{name}.{kind}", "w+", errors="replace") for kind in ("stdout", "stderr"))
        # a pieceworks cache of its own, as every test has (fresh_dynamo_and_cache)
        env = {
            k: v for k, v in (os.environ if env is None else env).items() if k != "PIECEWORKS_DISABLE_CACHE"
        }
        env["PIECEWORKS_CACHE_DIR"] = f"{name}.pieceworks-cache"
        proc = subprocess.Popen([str(a) for a in args], stdout=out, stderr=err, env=env, cwd=cwd)
        started.append((proc, out, err, time.monotonic() + timeout))

    def results(self, test) -> list[subprocess.CompletedProcess]:
        assert test.__name__ in self._running, f"no process was started for {test.__name__}"
        done, late = [], []
        for proc, out, err, deadline in self._running.pop(test.__name__):
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                timed_out = False
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                timed_out = True
            with out, err:
                out.seek(0)
                err.seek(0)
                done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out.read(), err.read()))
            if timed_out:
                late.append(
                    f"{' '.join(proc.args)} did not finish in time (killed); its output:\n"
                    f"{done[-1].stderr[-3000:]}{done[-1].stdout[-1000:]}"
                )
        if late:
            pytest.fail("\n".join(late))
        return done

    def close(self) -> None:
        for started in self._running.values():
            for proc, out, err, _ in started:
                proc.kill()
                proc.wait()
                out.close()
                err.close()
        self._running.clear()


@pytest.fixture(scope="module")
def early_processes(request, tmp_path_factory):
    """The module's `EarlyProcesses`; a module-scoped fixture of the module starts them, before its first
    test."""
    processes = EarlyProcesses(request, tmp_path_factory.mktemp("early-processes"))
    yield processes
    processes.close()
