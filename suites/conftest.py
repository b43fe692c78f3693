"""Shared fixtures: every test runs without autograd, with a fresh Dynamo and its own pieceworks cache."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from pieceworks.harness.strategies import register_profiles

# The repository root on sys.path, so that `suites.mutants` imports whatever the pytest run's root (a --pyargs run of the
# conformance suite from another folder loads this file too).
_REPO = str(Path(__file__).resolve().parent.parent)
if _REPO not in sys.path:
    sys.path.insert(0, _REPO)
# The gpu marker and timeouts; --pieceworks-mutant.
pytest_plugins = ["pieceworks.harness.pytest_plugin", "suites.mutants.plugin"]
register_profiles()

# The conformance suite runs on its own (`pytest -p pieceworks.conformance.plugin --pyargs pieceworks.conformance`, or
# `pytest suites/conformance`): it builds every implementation x model and would take minutes of `pytest suites -m gpu`, whose own GPU tests cover
# pieceworks. Its CPU tests (suites/test_conformance_*.py) run with the rest.
collect_ignore = ["conformance"]

# One Inductor cache for the whole session, never a developer's ~/.cache or a previous run's leftovers; removed when
# pytest's process exits. Assigned, not setdefault: importing torch already sets it (to the machine-wide
# /tmp/torchinductor_<user>).
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


@pytest.fixture
def cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA: no CUDA device visible to torch")
    return torch.device("cuda")
