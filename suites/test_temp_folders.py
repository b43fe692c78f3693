"""Nothing left behind: the warm-start command, the benchmarks and the test session remove every temporary
folder they make.

Each check runs with a private temporary folder (never the machine's /tmp, which other processes share) and
asserts that no `pieceworks-*` folder is left in it. The warm-start command and the compile benchmark run with
the scenario processes replaced by a stand-in that writes what a real one writes (the cache, Inductor's files
under the host's TMPDIR), so the check takes a second, not minutes of compiling.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pieceworks.harness.measure import warm_start

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def private_tmp(tmp_path, monkeypatch):
    folder = tmp_path / "tmp"
    folder.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.setenv("TMPDIR", str(folder))
    return folder


def _left(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("pieceworks-*"))


def _stand_in_scenario(*args: str, env: dict | None = None, unset: tuple = (), timeout: float = 600) -> dict:
    """What `run_scenario` leaves on disk (an artifact in the cache, Inductor's files under the host's TMPDIR)
    and a report of its shape."""
    cache = args[args.index("--cache-dir") + 1]
    os.makedirs(cache, exist_ok=True)
    Path(cache, "artifact").write_text("compiled")
    if env and "TMPDIR" in env:
        os.makedirs(os.path.join(env["TMPDIR"], "torchinductor_user"), exist_ok=True)
    return {
        "counters": collections.defaultdict(int),
        "first_call_s": 1.0,
        "max_rel_error": 0.0,
        "torch": "torch",
        "cache_dir": cache,
        "build_seconds": collections.defaultdict(float),
        "capture": {},
        "first_call_profile": {"host": env["TMPDIR"]} if "--profile" in args else None,
        "first_call_log": [],
    }


@pytest.mark.slow
def test_the_compile_benchmark_removes_its_folders_and_profiles_each_warm_start(private_tmp, monkeypatch):
    monkeypatch.setattr(warm_start, "run_scenario", _stand_in_scenario)
    monkeypatch.delenv("PIECEWORKS_BENCH_DETAILS", raising=False)
    monkeypatch.syspath_prepend(str(REPO / "suites"))
    from benchmarks import compile as compile_benchmark

    results = compile_benchmark.measure()
    assert set(results) == {*warm_start.STARTS, "floor"}
    assert _left(private_tmp) == []
    # each warm start is profiled once more, the new host's on a host of its own (an empty Inductor cache)
    hosts = {s: Path(results[s]["first_call_profile"]["host"]).name for s in ("warm", "warm_new_host")}
    assert hosts == {"warm": "host", "warm_new_host": "profiled-new-host"}


@pytest.mark.parametrize("forbidden", [True, False])
def test_where_bytecode_is_not_cached_a_priming_start_fills_a_cache_every_start_reads(
    private_tmp, monkeypatch, forbidden
):
    """Where torch's bytecode is not cached and PYTHONDONTWRITEBYTECODE is set (an image whose packages ship
    without .pyc), a priming start with caches of its own runs first, and every start, the priming one
    included, writes and reads one bytecode cache; where it is cached, the starts run as the environment says,
    and no priming start."""
    monkeypatch.setattr(warm_start, "bytecode_cached", lambda: not forbidden)
    floors: list[tuple] = []
    monkeypatch.setattr(
        warm_start, "floor_seconds", lambda env, unset, *imports: floors.append((env, unset)) or 1.0
    )
    seen: list[tuple] = []
    monkeypatch.setattr(
        warm_start,
        "run_scenario",
        lambda *args, **kw: seen.append((args, kw)) or _stand_in_scenario(*args, **kw),
    )
    monkeypatch.delenv("PYTHONPYCACHEPREFIX", raising=False)
    if forbidden:
        monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    else:
        monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    results = warm_start.measure("cpu", layers=1)
    assert results["floor"]["bytecode_primed"] is forbidden
    caches = [args[args.index("--cache-dir") + 1] for args, _ in seen]
    prefixes = {
        kw["env"].get("PYTHONPYCACHEPREFIX") for _, kw in [*seen, *((None, {"env": e}) for e, _ in floors)]
    }
    assert len(seen) == len(warm_start.STARTS) + forbidden
    if forbidden:
        assert caches[0] not in caches[1:] and "1,7,64,300" not in seen[0][0]  # its own cache, a short run
        assert len(prefixes) == 1 and None not in prefixes
        assert all(
            "PYTHONDONTWRITEBYTECODE" in unset
            for unset in [kw["unset"] for _, kw in seen] + [u for _, u in floors]
        )
    else:
        assert prefixes == {None} and len(set(caches)) == 1
    assert _left(private_tmp) == []


@pytest.mark.parametrize(
    "named", [None, pytest.param("harness/models/configs/tiny-llama.json", marks=pytest.mark.slow)]
)
def test_the_user_model_starts_from_the_config_named_else_the_shipped_tiny_qwen3(
    private_tmp, monkeypatch, named
):
    seen: list[tuple] = []
    monkeypatch.setattr(
        warm_start, "run_scenario", lambda *args, **kw: seen.append(args) or _stand_in_scenario(*args, **kw)
    )
    monkeypatch.delenv("PIECEWORKS_BENCH_DETAILS", raising=False)
    if named:
        monkeypatch.setenv("PIECEWORKS_MODEL_CONFIG", named)
    else:
        monkeypatch.delenv("PIECEWORKS_MODEL_CONFIG", raising=False)
    monkeypatch.syspath_prepend(str(REPO / "suites"))
    from benchmarks import compile as compile_benchmark

    assert set(compile_benchmark.measure("hf")) == {*warm_start.STARTS, "floor"}
    configs = {Path(args[args.index("--config") + 1]).name for args in seen}
    assert configs == {Path(named or "tiny-qwen3.json").name} and all(args[1] == "hf" for args in seen)


def _python(code: str, tmp: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp)}
    env.pop("PIECEWORKS_BENCH_DIR", None)
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_the_benchmarks_shared_folder_goes_when_its_process_exits(private_tmp):
    _python(
        "import os, sys; sys.path.insert(0, 'suites'); from benchmarks import _shared; "
        "assert os.path.isdir(_shared.run_dir())",
        private_tmp,
    )
    assert _left(private_tmp) == []


def test_a_test_session_removes_its_inductor_cache(private_tmp):
    _python(
        "import sys, pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', "
        "'suites/test_config.py::test_ranges_follow_vllm_endpoints']))",
        private_tmp,
    )
    assert _left(private_tmp) == []


def test_the_cache_state_machine_removes_its_folder(private_tmp):
    from test_cache_machine import CacheMachine

    machine = CacheMachine()
    assert _left(private_tmp)
    machine.teardown()
    assert _left(private_tmp) == []
