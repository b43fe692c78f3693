"""Parametrisation, order and builds of the conformance suite (its options and results: plugin.py; the run the
options make: run.py; the sizes and batches it serves: plan.py).

- Every test taking `subject` runs once per selected implementation x model (`--impl`, `--conformance-model`).
- Tests run subject by subject (model, then implementation, then property), so each subject is built once
  (`Builds`), for the run's drawn capture sizes; the compile-cache tests of a model run after all its other
  tests, when every implementation has written its cache entries.
- The device is `--conformance-device`: auto (the default) is cuda where the machine has CUDA, else cpu. On
  cuda every subject test is a gpu test with a timeout of 300 s (its build included). On cpu the properties
  that read the CUDA caching allocator are "not applicable"; a run in which no test ran at all fails
  (`plugin.nothing_ran`).
- No Dynamo reset between tests (it would invalidate torch.compile-based builds); calls run under no_grad; one
  pieceworks cache directory for the session (what the warm-start property's fresh process reads).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch

# by their installed names, as the plugin imports them: pytest imports this file under another package name
# (suites.conformance, conformance), and a second copy of run.py would draw a second seed
from pieceworks.conformance.plan import Plan
from pieceworks.conformance.run import resolve
from pieceworks.conformance.subjects import (
    PROPERTIES,
    Builds,
    Subject,
    impl_unavailable,
    not_applicable,
    not_observable,
    unavailable,
)

# `pytest path/to/conformance` loads the plugin here; `--pyargs` runs need `-p pieceworks.conformance.plugin`,
# since the options must exist before pytest reads the arguments.
pytest_plugins = ["pieceworks.conformance.plugin"]

_ORDER = list(PROPERTIES)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "subject" in metafunc.fixturenames:
        subjects = resolve(metafunc.config).subjects
        metafunc.parametrize("subject", subjects, ids=[s.id for s in subjects])


def _property_of(item: pytest.Item) -> str:
    marker = item.get_closest_marker("conformance")
    if marker is None or marker.args[0] not in PROPERTIES:
        raise pytest.UsageError(
            f"{item.nodeid}: a conformance test needs @pytest.mark.conformance(<one of {list(PROPERTIES)}>)"
        )
    return marker.args[0]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # imported once pytest_plugins has it
    from pieceworks.conformance.plugin import CONFORMANCE_KEY, CONFORMANCE_META

    run = resolve(config)
    rank = {s.id: i for i, s in enumerate(run.subjects)}
    models = list(dict.fromkeys(s.case.name for s in run.subjects))

    def key(item: pytest.Item) -> tuple:
        subject = (callspec := getattr(item, "callspec", None)) and callspec.params.get("subject")
        if subject is None:
            return (-1,)
        prop = _property_of(item)
        return (
            models.index(subject.case.name),
            prop == "warm-start-compiles-nothing",
            rank[subject.id],
            _ORDER.index(prop),
        )

    for item in items:
        subject = (callspec := getattr(item, "callspec", None)) and callspec.params.get("subject")
        if subject is None or not isinstance(item, pytest.Function):  # a parametrized item is a Function
            continue
        item.user_properties.append(
            (
                CONFORMANCE_KEY,
                {
                    "impl": subject.impl.name,
                    "model": subject.case.name,
                    "property": _property_of(item),
                    "fixtures": list(item.fixturenames),
                },
            )
        )
        if run.device == "cuda":
            item.add_marker(pytest.mark.gpu)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(300))
    items.sort(key=key)
    config.stash[CONFORMANCE_META] = _describe(config)


def _describe(config: pytest.Config) -> dict:
    """The run, for the JSON: device, versions, seed, capture sizes, batches, implementations with
    capabilities and reasons."""
    run = resolve(config)
    impls: dict[str, dict[str, Any]] = {}
    cases: dict[str, dict[str, Any]] = {}
    for s in run.subjects:
        impls.setdefault(
            s.impl.name,
            {
                "spec": s.spec,
                "capabilities": dataclasses.asdict(s.impl.capabilities),
                "contracts": dict(s.impl.contracts),
                "unavailable": impl_unavailable(s.impl, run.device),
            },
        )
        cases.setdefault(
            s.case.name, {"splitting_ops": list(s.case.splitting_ops), "unavailable": s.case.unavailable()}
        )
    cuda = torch.cuda.is_available()
    plan = run.plan
    return {
        "device": run.device,
        "gpu": torch.cuda.get_device_name() if cuda and run.device == "cuda" else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "seed": plan.seed,
        "capture_sizes": list(plan.capture_sizes),
        "batches": plan.batches,
        "largest_batch": plan.largest_batch,
        "plan": plan.describe(),
        "properties": {name: text for name, (_, text) in PROPERTIES.items()},
        "implementations": impls,
        "models": cases,
    }


@pytest.fixture(autouse=True)
def fresh_dynamo_and_cache():
    """Overrides the repository's fixture of this name: no Dynamo reset between tests (builds outlive a
    test)."""
    with torch.no_grad():
        yield


@pytest.fixture(scope="session", autouse=True)
def _session_cache(tmp_path_factory):
    """One pieceworks cache for the session, unless $PIECEWORKS_CACHE_DIR names one (the warm start reads
    it)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PIECEWORKS_CACHE_DIR", str(tmp_path_factory.mktemp("pieceworks-cache")))
        patch.delenv("PIECEWORKS_DISABLE_CACHE", raising=False)
        yield os.environ["PIECEWORKS_CACHE_DIR"]


@pytest.fixture(scope="session")
def builds(request) -> Iterator[Builds]:
    run = resolve(request.config)
    value = Builds(run.device, list(run.plan.capture_sizes))
    yield value
    value.drop()


@pytest.fixture
def device(request) -> str:
    return resolve(request.config).device


@pytest.fixture
def plan(request) -> Plan:
    """The run's seed, capture sizes and batch sequences; for a test of one subject, its far batches capped
    at the batches its model serves."""
    plan = resolve(request.config).plan
    if "subject" in request.fixturenames:
        plan = dataclasses.replace(plan, max_batch=request.getfixturevalue("subject").case.max_batch)
    return plan


@pytest.fixture
def selected(request) -> list[Subject]:
    """Every subject of this run."""
    return resolve(request.config).subjects


@pytest.fixture
def served(request, subject: Subject, builds: Builds, device: str, plan: Plan):
    """(eager model, build) of the subject, after the checks that make the test's property not applicable or
    the subject unavailable (each a skip whose reason starts with "not applicable:" / "unavailable:")."""
    prop = _property_of(request.node)
    reason = unavailable(subject, device, plan.largest_batch)
    if reason:
        pytest.skip(f"unavailable: {reason}")
    reason = not_applicable(subject, prop, device)
    if reason:
        pytest.skip(f"not applicable: {reason}")
    # needs a build in this run (its cache entries), not the current one
    if prop == "warm-start-compiles-nothing":
        if subject.id not in builds.compiles:
            builds.get(subject)
        if builds.compiles[subject.id] is None:
            pytest.skip(
                f"not applicable: {subject.impl.name}: "
                f"{subject.impl.contracts.get('compiles', 'Built.compiles is None: compiles not observable')}"
            )
        return None
    model, built = builds.get(subject)
    reason = not_observable(subject, prop, built)
    if reason:
        pytest.skip(f"not applicable: {reason}")
    return model, built
