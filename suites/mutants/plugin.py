"""pytest plugin of the suites (suites/conftest.py loads it): `--pieceworks-mutant NAME`, or
$PIECEWORKS_MUTANT, applies mutant NAME for the session; an unknown name is a usage error.

The session hands the mutant to every process it starts: $PIECEWORKS_MUTANT names it, $PYTEST_PLUGINS loads
this plugin into child pytest sessions (the conformance suite's included), $PIECEWORKS_STARTUP_HOOK makes the
children of `pieceworks.harness.testing.scenario` (`run_case`, `run_scenario`) apply it, and $PYTHONPATH gets
the repository root so that children started in any directory import this package.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pieceworks.harness.testing.scenario import STARTUP_HOOK

from . import ENV, apply

_REPO = Path(__file__).resolve().parents[2]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--pieceworks-mutant",
        default=None,
        metavar="NAME",
        help=f"run the tests against mutant NAME of suites/mutants (also ${ENV})",
    )


def pytest_configure(config: pytest.Config) -> None:
    name = config.getoption("--pieceworks-mutant", default=None) or os.environ.get(ENV)
    if not name:
        return
    patch = pytest.MonkeyPatch()
    config.add_cleanup(patch.undo)
    found = apply(name, patch)
    patch.setenv(ENV, name)
    patch.setenv(STARTUP_HOOK, f"{__package__}:apply_from_environment")
    for variable, value, separator in (
        ("PYTEST_PLUGINS", __name__, ","),
        ("PYTHONPATH", str(_REPO), os.pathsep),
    ):
        patch.setenv(variable, separator.join(filter(None, [value, os.environ.get(variable)])))
    config.issue_config_time_warning(
        pytest.PytestWarning(f"pieceworks mutant {name}: {found.description}"), 2
    )
