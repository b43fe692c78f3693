"""The pytest plugin: every gpu test gets a timeout (pytest-timeout's marker) and, without CUDA, a reason to
skip; without pytest-timeout, one warning says gpu tests have no timeout. The plugin is opt-in: no entry point
loads it."""

from __future__ import annotations

import importlib.metadata

import pytest
import torch

from pieceworks.harness.testing import pytest_plugin


class _Item:
    def __init__(self, *markers):
        self.markers = list(markers)

    def get_closest_marker(self, name):
        return next((m for m in self.markers if m.name == name), None)

    def add_marker(self, marker):
        self.markers.append(getattr(marker, "mark", marker))


class _Config:
    """What the plugin reads of pytest's config: its option, whether pytest-timeout is active; warnings it
    issues."""

    def __init__(self, has_timeout: bool):
        self.pluginmanager = self
        self.has_timeout = has_timeout
        self.warnings = []

    def getoption(self, name):
        return {"--pieceworks-gpu-timeout": 7.0}[name]

    def hasplugin(self, name):
        return name == "timeout" and self.has_timeout

    def issue_config_time_warning(self, warning, stacklevel):
        self.warnings.append(warning)


def test_every_gpu_test_gets_a_timeout_and_without_cuda_a_reason_to_skip():
    plain, gpu, own = (
        _Item(),
        _Item(pytest.mark.gpu.mark),
        _Item(pytest.mark.gpu.mark, pytest.mark.timeout(30).mark),
    )
    pytest_plugin.pytest_collection_modifyitems(_Config(has_timeout=True), [plain, gpu, own])
    assert plain.markers == []
    assert gpu.get_closest_marker("timeout").args == (7.0,)
    assert own.get_closest_marker("timeout").args == (30,)
    if not torch.cuda.is_available():
        for item in (gpu, own):
            assert "needs CUDA" in item.get_closest_marker("skip").kwargs["reason"]


@pytest.mark.parametrize("has_timeout", [True, False])
def test_gpu_tests_without_pytest_timeout_get_one_warning(monkeypatch, has_timeout):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the gpu tests would run
    config = _Config(has_timeout)
    pytest_plugin.pytest_collection_modifyitems(
        config, [_Item(pytest.mark.gpu.mark), _Item(pytest.mark.gpu.mark)]
    )
    assert len(config.warnings) == (0 if has_timeout else 1)
    assert all("gpu tests have no timeout" in str(w) for w in config.warnings)


def test_the_plugin_is_opt_in_and_this_session_has_pytest_timeout(pytestconfig):
    entry_points = importlib.metadata.entry_points(group="pytest11")
    assert not [e for e in entry_points if e.value.startswith("pieceworks")]
    # suites/conftest.py loads it
    assert pytestconfig.pluginmanager.hasplugin("pieceworks.harness.testing.pytest_plugin")
    assert pytestconfig.pluginmanager.hasplugin("timeout")
