"""pytest plugin (entry point `pytest11: pieceworks`): the `gpu` marker and its skip rule, and `--pieceworks-mutant`.

A test marked `@pytest.mark.gpu` is skipped with the reason spelled out when CUDA is absent, so `pytest` on a
CPU machine stays green for the right reason and `pytest -m gpu` on a GPU runner runs them. Importing this module
does not import torch; the check runs once, at collection, and only when a gpu test was collected.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--pieceworks-mutant", default=None,
                     help="run the suites against a deliberately broken reference (see pieceworks.harness.mutants)")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "gpu: needs a CUDA device (run with -m gpu on a GPU runner)")
    name = config.getoption("--pieceworks-mutant", default=None)
    if name:
        from .mutants import apply

        patch = pytest.MonkeyPatch()
        description = apply(name, patch)
        config.add_cleanup(patch.undo)
        config.issue_config_time_warning(pytest.PytestWarning(f"pieceworks mutant {name}: {description}"), 2)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if not gpu_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(
        reason=f"needs CUDA: torch {torch.__version__} sees no CUDA device here; run `pytest -m gpu` on a GPU runner"
    )
    for item in gpu_items:
        item.add_marker(skip)
