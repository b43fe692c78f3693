"""warm-start-compiles-nothing (implementations with a compile cache whose compiles are observable): after
the pytest session built a model (writing the cache in $PIECEWORKS_CACHE_DIR), a fresh process building it
again compiles nothing (`Built.compiles == 0`) and serves every batch of the sweep like eager. One fresh
process per model builds it with every selected implementation that applies; these tests run after the
model's other tests (see conftest)."""

from __future__ import annotations

import os
import sys

import pytest

from pieceworks.harness.testing.scenario import run_case

from . import subjects
from .subjects import not_applicable, unavailable

_REPORTS: dict[str, dict] = {}


def _warm_start(model: str, specs: list[str], device: str, plan) -> dict:
    """One fresh process per model, for every spec given; its report is kept for the model's other tests."""
    if model not in _REPORTS:
        target = f"{subjects.__name__}:warm_start_case"
        case = {
            "specs": specs,
            "model": model,
            "device": device,
            "capture_sizes": list(plan.capture_sizes),
            "batches": plan.batches,
        }
        with pytest.MonkeyPatch.context() as patch:  # the child imports what this process imports, as it does
            patch.setenv("PYTHONPATH", os.pathsep.join(p for p in sys.path if p))
            _REPORTS[model] = run_case(target, case, timeout=280)
    return _REPORTS[model]


@pytest.mark.conformance("warm-start-compiles-nothing")
def test_a_warm_start_compiles_nothing(subject, served, builds, device, selected, plan):
    peers = [
        s
        for s in selected
        if s.case.name == subject.case.name
        and not unavailable(s, device, plan.largest_batch)
        and not not_applicable(s, "warm-start-compiles-nothing", device)
    ]
    for peer in peers:  # every implementation in the child must have written its entries first
        if peer.id not in builds.compiles:
            builds.get(peer)
    builds.drop()
    peers = [peer for peer in peers if builds.compiles.get(peer.id) is not None]
    report = _warm_start(subject.case.name, [p.spec for p in peers], device, plan)[subject.spec]
    assert report["error"] is None, f"the warm start failed: {report['error']}"
    assert report["compiles"] == 0, f"a warm start compiled {report['compiles']} pieces"
    assert report["checked"] > 0
