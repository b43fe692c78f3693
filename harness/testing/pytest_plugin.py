"""pytest plugin, opt-in (`-p pieceworks.harness.testing.pytest_plugin`): a test marked `gpu` is skipped, with
the reason, where CUDA is absent (torch is imported only once a gpu test is collected), and gets
pytest-timeout's `timeout(--pieceworks-gpu-timeout)`, default 120 s, unless it has a `timeout` marker; without
pytest-timeout, one warning says gpu tests have no timeout."""

from __future__ import annotations

import pytest

GPU_TIMEOUT_S = 120.0


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--pieceworks-gpu-timeout",
        type=float,
        default=GPU_TIMEOUT_S,
        help=f"seconds a gpu test may take unless it is marked timeout(s) (default {GPU_TIMEOUT_S:g})",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (run with -m gpu on a GPU runner)")
    if not config.pluginmanager.hasplugin("timeout"):  # the marker stays valid under --strict-markers
        config.addinivalue_line("markers", "timeout(seconds): a time limit (needs pytest-timeout)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    for item in gpu_items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(config.getoption("--pieceworks-gpu-timeout")))
    import torch

    if torch.cuda.is_available():
        if not config.pluginmanager.hasplugin("timeout"):
            config.issue_config_time_warning(
                pytest.PytestWarning(
                    "pytest-timeout is not installed: gpu tests have no timeout, and a hung kernel hangs the "
                    "run. Fix: pip install pytest-timeout (in the `test` extra)"
                ),
                2,
            )
        return
    skip = pytest.mark.skip(
        reason=f"needs CUDA: torch {torch.__version__} sees no CUDA device here; run "
        "`pytest -m gpu` on a GPU runner"
    )
    for item in gpu_items:
        item.add_marker(skip)
