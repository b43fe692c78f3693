"""Every mutant is declared with tests that exist, and applying one works in this pytest process and its child
processes.

`python -m suites.mutants` runs each mutant of `suites.mutants` against its `cpu` (or `gpu`) node ids. A
target naming a moved or renamed test is an error (pytest exit status 4) that would count as SURVIVED only
when someone runs it; a mutant patching a name that no longer exists would fail only then too. Both are caught
here, without compiling anything.
"""

from __future__ import annotations

import inspect
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from suites.mutants import AREAS, all_mutants, apply

REPO = Path(__file__).resolve().parent.parent
MUTANTS = all_mutants()
_NODE_IDS = [
    (kind, name, node_id)
    for name, m in MUTANTS.items()
    for kind, target in (("cpu", m.cpu), ("gpu", m.gpu))
    for node_id in target.split()
]


def test_every_area_module_is_loaded():
    files = {p.stem for p in (REPO / "suites" / "mutants").glob("*.py")} - {"__init__", "__main__", "plugin"}
    assert files == set(AREAS), "list each area module of suites/mutants in AREAS, or its mutants never load"


@pytest.mark.parametrize("kind, mutant, node_id", _NODE_IDS, ids=[f"{k}-{m}-{i}" for k, m, i in _NODE_IDS])
def test_every_target_names_an_existing_test(kind, mutant, node_id):
    path, *names = node_id.split("::")
    file = REPO / path
    assert path.startswith("suites/") and file.is_file(), f"{kind} target of {mutant}: no test file {path}"
    text = file.read_text()
    for name in names:
        name = name.split("[", 1)[0]  # parametrized case: the function (or class) must exist
        assert re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{re.escape(name)}\b", text, re.M), (
            f"{kind} target of {mutant}: {path} defines no test {name}"
        )


class _Recording(pytest.MonkeyPatch):
    """A MonkeyPatch that keeps `(target, name, original, stand-in)` of each
    `setattr(target, name, value)`."""

    def __init__(self) -> None:
        super().__init__()
        self.replaced: list[tuple[object, str, object, object]] = []

    def setattr(self, target, name, *value, **options):
        if not isinstance(target, str):  # `setattr(target, name, value)`; not `setattr("module.name", value)`
            self.replaced.append(
                (target, name, getattr(target, name, None), (*value, options.get("value"))[0])
            )
        super().setattr(target, name, *value, **options)


def stand_in_problem(original: object, stand_in: object) -> str | None:
    """Why `stand_in` cannot be called as `original` is, with every parameter it takes, or None (also where
    either is not a Python function: a builtin, a class, a value)."""
    if not inspect.isfunction(original) or not callable(stand_in) or isinstance(stand_in, type):
        return None
    params = inspect.signature(original).parameters.values()
    positional = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    keywords = {p.name: p.name for p in params if p.kind is p.KEYWORD_ONLY}
    try:
        inspect.signature(stand_in).bind(*positional, **keywords)
    except ValueError:  # a builtin without a signature
        return None
    except TypeError as exc:
        return f"it takes {inspect.signature(stand_in)}, the original {inspect.signature(original)}: {exc}"
    return None


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_every_mutant_patches_names_that_exist_with_stand_ins_that_take_their_arguments(name):
    """A stand-in that drifted from the signature it replaces "catches" by a TypeError, testing nothing."""
    mp = _Recording()
    try:  # setattr raises AttributeError for a name that is gone
        apply(name, mp)
        problems = [
            f"{getattr(t, '__name__', t)}.{attr}: {why}"
            for t, attr, original, stand_in in mp.replaced
            if (why := stand_in_problem(original, stand_in))
        ]
    finally:
        mp.undo()
    assert not problems, f"mutant {name} replaces " + "; ".join(problems)


def test_a_stand_in_that_takes_fewer_arguments_is_found():
    def original(a, b, c=None, *, d=1):
        return a

    assert stand_in_problem(original, lambda a, b, c=None, *, d=1: a) is None
    assert stand_in_problem(original, lambda *args, **kwargs: None) is None
    assert "too many positional" in stand_in_problem(original, lambda a, b: a)
    assert "unexpected keyword" in stand_in_problem(original, lambda a, b, c=None: a)


@pytest.mark.slow
def test_an_unknown_mutant_is_a_usage_error():
    with pytest.raises(pytest.UsageError, match="unknown pieceworks mutant 'no_such_mutant'"):
        apply("no_such_mutant", pytest.MonkeyPatch())
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "suites/test_layout.py", "-p", "no:cacheprovider", "-q"],
        cwd=REPO,
        env={**os.environ, "PIECEWORKS_MUTANT": "no_such_mutant"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 4 and "unknown pieceworks mutant 'no_such_mutant'" in proc.stderr, proc.stderr[
        -2000:
    ]


PROBE = """
from pieceworks.conformance import plugin
from pieceworks.harness.testing import scenario


def nothing_ran_says():
    return plugin.nothing_ran([{"outcome": "skipped", "reason": "probe"}])


def test_probe():
    assert nothing_ran_says() is None  # this pytest process runs the mutant
    assert scenario.run_case(f"{__file__}:nothing_ran_says") is None  # and so does the case run in a child
"""


def test_a_mutant_reaches_the_session_and_the_processes_it_starts(tmp_path):
    """`--pieceworks-mutant` from the plugin alone, in a session rooted outside the repository: the tests and
    `scenario.run_case`'s child see the mutant (conformance_nothing_ran_passes, which makes `nothing_ran`
    quiet)."""
    (tmp_path / "test_probe.py").write_text(PROBE)
    command = [
        sys.executable,
        "-m",
        "pytest",
        str(tmp_path / "test_probe.py"),
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "suites.mutants.plugin",
        "--pieceworks-mutant",
        "conformance_nothing_ran_passes",
    ]
    proc = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="needs a machine where the GPU target skips"
)
def test_a_target_that_only_skipped_gives_no_verdict():
    """A mutant whose target tests all skip here (a GPU test without CUDA) is neither caught nor survived."""
    from suites.mutants.__main__ import run_one

    name = "attention_sees_one_position_more"
    caught, detail = run_one(name, MUTANTS[name].gpu, None, 300)
    assert caught is None and "skipped" in detail, detail
