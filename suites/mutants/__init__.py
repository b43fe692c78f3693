"""Mutants: deliberately broken variants of pieceworks, each declared with the tests that must catch it.

A mutant is a function of a `pytest.MonkeyPatch` that patches public names of `pieceworks`,
`pieceworks.harness` or `pieceworks.gate`, registered by `@mutant(description, cpu=..., gpu=...)`: `cpu` and
`gpu` are pytest node ids (space-separated, run in one pytest) that must fail under it. `pytest ...
--pieceworks-mutant NAME` applies one (plugin.py); `python -m suites.mutants` runs each against its tests
(__main__.py). Importing this package is cheap: the area modules, and with them pieceworks, load on the first
call of `all_mutants` or `apply`.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Callable

import pytest

__all__ = ["MUTANTS", "Mutant", "all_mutants", "apply", "apply_from_environment", "mutant"]

ENV = "PIECEWORKS_MUTANT"  # the mutant of this process and of every process it starts
AREAS = ("cache", "calls", "compile", "config", "gate", "implementations", "replay", "report", "timing")


@dataclasses.dataclass(frozen=True)
class Mutant:
    name: str
    description: str
    mutate: Callable[[pytest.MonkeyPatch], None]
    cpu: str  # node ids that must fail under it on a CPU machine ("" for none)
    gpu: str  # and on a GPU runner


MUTANTS: dict[str, Mutant] = {}


def mutant(description: str, *, cpu: str = "", gpu: str = "") -> Callable:
    """Register the decorated function as the mutant of its name."""

    def register(mutate: Callable[[pytest.MonkeyPatch], None]) -> Callable[[pytest.MonkeyPatch], None]:
        name = mutate.__name__
        if name in MUTANTS or not (cpu or gpu):
            raise ValueError(
                f"mutant {name}: {'declared twice' if name in MUTANTS else 'no test to catch it'}"
            )
        MUTANTS[name] = Mutant(name, description, mutate, cpu, gpu)
        return mutate

    return register


def all_mutants() -> dict[str, Mutant]:
    """Every mutant, by name."""
    for area in AREAS:
        importlib.import_module(f"{__name__}.{area}")
    return MUTANTS


def apply(name: str, mp: pytest.MonkeyPatch) -> Mutant:
    """Apply mutant `name` through `mp` (`mp.undo()` reverts it). An unknown name is a `pytest.UsageError`."""
    found = all_mutants().get(name)
    if found is None:
        raise pytest.UsageError(
            f"unknown pieceworks mutant {name!r} (--pieceworks-mutant or ${ENV}); "
            f"known: {', '.join(sorted(MUTANTS))}"
        )
    found.mutate(mp)
    return found


def apply_from_environment() -> None:
    """The start-up hook of a mutant run's child processes: apply $PIECEWORKS_MUTANT for the process's
    lifetime."""
    apply(os.environ[ENV], pytest.MonkeyPatch())
