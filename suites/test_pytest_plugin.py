"""The pytest plugin: a stuck test ends with a verdict (the plugin's fallback where pytest-timeout is missing);
every gpu test gets a timeout and, without CUDA, a reason to skip."""

from __future__ import annotations

import time

import pytest
import torch

from pieceworks.harness import pytest_plugin


class _Item:
    def __init__(self, *markers, config=None):
        self.markers = list(markers)
        self.config = config

    def get_closest_marker(self, name):
        return next((m for m in self.markers if m.name == name), None)

    def add_marker(self, marker):
        self.markers.append(getattr(marker, "mark", marker))


class _Config:
    """What the plugin reads of pytest's config: options, ini values, whether pytest-timeout is active."""

    def __init__(self):
        self.pluginmanager = self
        self.warnings = []

    def getoption(self, name):
        return {"--pieceworks-gpu-timeout": 7.0}[name]

    def getini(self, name):
        return {"timeout": ""}[name]

    def hasplugin(self, name):
        return False  # as without pytest-timeout: the plugin's own fallback acts

    def issue_config_time_warning(self, warning, stacklevel):
        self.warnings.append(warning)


def test_a_stuck_test_fails_on_its_timeout_and_the_process_goes_on():
    item = _Item(pytest.mark.timeout(0.5).mark, config=_Config())
    wrapper = pytest_plugin.pytest_runtest_call(item)
    next(wrapper)  # the plugin arms its timers; now the "test" runs
    start = time.perf_counter()
    with pytest.raises(pytest.fail.Exception, match="ran past its 0.5 s limit"):
        time.sleep(20)
    assert time.perf_counter() - start < 10
    with pytest.raises(StopIteration):
        next(wrapper)  # the test is over: timers disarmed
    time.sleep(0.7)  # no alarm left behind


def test_every_gpu_test_gets_a_timeout_and_without_cuda_a_reason_to_skip():
    plain, gpu, own = _Item(), _Item(pytest.mark.gpu.mark), _Item(pytest.mark.gpu.mark, pytest.mark.timeout(30).mark)
    pytest_plugin.pytest_collection_modifyitems(_Config(), [plain, gpu, own])
    assert plain.markers == []
    assert gpu.get_closest_marker("timeout").args == (7.0,)
    assert own.get_closest_marker("timeout").args == (30,)
    if not torch.cuda.is_available():
        for item in (gpu, own):
            assert "needs CUDA" in item.get_closest_marker("skip").kwargs["reason"]
