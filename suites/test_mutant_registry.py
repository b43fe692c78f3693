"""Every mutant has a test that must catch it, and every such target names a test that exists.

`pieceworks.harness.run_mutants` runs each mutant of `pieceworks.harness.mutants.MUTANTS` against its targets:
`TARGETS` (CPU) or `GPU_TARGETS` (GPU), pytest node ids separated by spaces. A mutant without a target is never
run, and a target naming a moved or renamed test is an error (pytest exit status 4) that counts as SURVIVED only
when someone runs it; both are caught here, without compiling anything.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from pieceworks.harness.mutants import MUTANTS
from pieceworks.harness.run_mutants import GPU_TARGETS, TARGETS

REPO = Path(__file__).resolve().parent.parent


def _node_ids() -> list[tuple[str, str, str]]:
    return [(kind, mutant, node_id) for kind, targets in (("CPU", TARGETS), ("GPU", GPU_TARGETS))
            for mutant, target in targets.items() for node_id in target.split()]


def test_every_mutant_has_a_target():
    missing = sorted(name for name in MUTANTS if name not in TARGETS and name not in GPU_TARGETS)
    assert not missing, f"mutants with no test to catch them (add them to TARGETS or GPU_TARGETS): {missing}"


def test_every_target_is_a_known_mutant_with_at_least_one_node_id():
    for kind, targets in (("CPU", TARGETS), ("GPU", GPU_TARGETS)):
        unknown = sorted(set(targets) - set(MUTANTS))
        assert not unknown, f"{kind} targets for mutants that MUTANTS does not define: {unknown}"
        empty = sorted(name for name, target in targets.items() if not target.split())
        assert not empty, f"{kind} targets naming no test: {empty}"


@pytest.mark.parametrize("kind, mutant, node_id", _node_ids(), ids=[f"{k}-{m}-{i}" for k, m, i in _node_ids()])
def test_every_target_names_an_existing_test(kind, mutant, node_id):
    path, *names = node_id.split("::")
    file = REPO / path
    assert path.startswith("suites/") and file.is_file(), f"{kind} target of {mutant}: no test file {path}"
    text = file.read_text()
    for name in names:
        name = name.split("[", 1)[0]  # parametrized case: the function (or class) must exist
        assert re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(name)}\b", text, re.M), (
            f"{kind} target of {mutant}: {path} defines no test {name}")
