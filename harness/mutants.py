"""Deliberately broken variants of the reference, to show that each property catches a real bug.

`pytest suites/test_properties.py --pieceworks-mutant NAME` applies mutant NAME before the suites import
pieceworks; the property it targets must then fail, and hypothesis shows the shrunk example. Never used otherwise.
See results/property_mutants.md for what each run printed.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable

import pytest

__all__ = ["MUTANTS", "apply"]


def _split_loses_order(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.split as split

    original = split.split_module
    mp.setattr(split, "split_module", lambda *a, **k: original(*a, **{**k, "keep_original_order": False}))


def _getitem_to_next_piece(mp: pytest.MonkeyPatch) -> None:
    import operator

    import pieceworks.split as split

    original = split._assign_pieces

    def assign(gm, ops):
        piece_of, splitting = original(gm, ops)
        for node in piece_of:
            if node.target is operator.getitem and piece_of[node] in splitting:
                piece_of[node] += 1
        return piece_of, splitting

    mp.setattr(split, "_assign_pieces", assign)


def _index_without_checksum(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.cache as cache

    mp.setattr(cache, "_entries_digest", lambda entries: "unchecked")


def _key_ignores_config(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.compiler as compiler

    original = compiler.cache_factors

    def factors(gm, fakes, config):
        found = original(gm, fakes, config)
        found.pop("config")
        return found

    mp.setattr(compiler, "cache_factors", factors)


def _pad_to_the_size_below(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.api as api
    import pieceworks.dispatch as dispatch

    def padded(sizes, batch):
        i = bisect.bisect_right(sizes, batch)
        return sizes[i - 1] if i > 0 and sizes[i - 1] >= batch else (sizes[i] if i < len(sizes) else None)

    def wrong(sizes, batch):  # one size too far: correct only when the batch is exactly a captured size
        i = bisect.bisect_left(sizes, batch)
        return sizes[i] if i < len(sizes) and sizes[i] == batch else (sizes[i - 1] if i > 0 else padded(sizes, batch))

    mp.setattr(dispatch, "padded_size", wrong)
    mp.setattr(api, "padded_size", wrong)


def _static_copy_misses_last_row(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.padding as padding

    def load(self, args, batch, n):
        for buffer, a in zip(self.buffers, args):
            if hasattr(a, "shape") and batch > 1:
                buffer[: batch - 1].copy_(a[: batch - 1])
        return self.views(n)

    mp.setattr(padding.StaticInputs, "load", load)


def _load_without_checking(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.cache as cache

    def load(self, name, loader):
        entry = self.read_index().get(name)
        if entry is None:
            return None
        path = os.path.join(self.artifact_dir, entry["file"])
        try:
            return loader(path)
        except Exception:  # noqa: BLE001
            return None

    mp.setattr(cache.CompileCache, "load", load)


# ---- CI (issue 11): the benchmark gate and the preflight ----
def _gate_ratio_inverted(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.gate.verdicts as verdicts

    mp.setattr(verdicts, "ratio_of", lambda base, head: 1.0 if base == head else base / head if head else float("inf"))


def _gate_one_threshold_for_all(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.gate.thresholds as thresholds

    mp.setattr(thresholds.Rule, "threshold", lambda self, spread: max(0.10, self.noise_k * spread))


def _gate_ignores_noise(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.gate.thresholds as thresholds

    mp.setattr(thresholds.Rule, "threshold", lambda self, spread: self.max_ratio - 1.0)


def _gate_missing_is_ok(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.gate as gate
    import pieceworks.gate.verdicts as verdicts

    original = verdicts.compare

    def without_missing(base, head, thresholds):
        return [row for row in original(base, head, thresholds) if row.verdict != verdicts.MISSING]

    mp.setattr(verdicts, "compare", without_missing)
    mp.setattr(gate, "compare", without_missing)


def _gate_failures_pass(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.gate.verdicts as verdicts

    mp.setattr(verdicts, "INCOMPLETE", verdicts.INCOMPLETE - {verdicts.FAILED_IN_HEAD})


def _gate_improvements_fail(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.gate.verdicts as verdicts

    original = verdicts.judge

    def judge(*args, **kwargs):
        verdict, *rest = original(*args, **kwargs)
        return (verdicts.REGRESSED if verdict == verdicts.IMPROVED else verdict, *rest)

    mp.setattr(verdicts, "judge", judge)


MUTANTS: dict[str, tuple[str, Callable[[pytest.MonkeyPatch], None]]] = {
    "gate_ratio_inverted": ("the gate computes base / head: slower looks faster", _gate_ratio_inverted),
    "gate_one_threshold_for_all": ("every metric gets the latency threshold (10%), pool bytes included",
                                   _gate_one_threshold_for_all),
    "gate_ignores_noise": ("the gate's threshold ignores the measured spread", _gate_ignores_noise),
    "gate_missing_is_ok": ("benchmarks missing from head are left out of the table", _gate_missing_is_ok),
    "gate_failures_pass": ("a benchmark that failed in head does not make the comparison incomplete",
                           _gate_failures_pass),
    "gate_improvements_fail": ("an improvement beyond the threshold fails like a regression", _gate_improvements_fail),
    "split_loses_order": ("split_module without keep_original_order (properties 1, 2)", _split_loses_order),
    "getitem_to_next_piece": ("getitems of a splitting op go to the next piece (property 2)", _getitem_to_next_piece),
    "index_without_checksum": ("the index's SHA-256 is not checked (property 3)", _index_without_checksum),
    "key_ignores_config": ("the cache key leaves out the config (property 4)", _key_ignores_config),
    "pad_to_the_size_below": ("padding picks the captured size below the batch (properties 5, 6)",
                              _pad_to_the_size_below),
    "static_copy_misses_last_row": ("the last real row is not copied into the static buffer (property 6)",
                                    _static_copy_misses_last_row),
    "load_without_checking": ("artifacts load without their SHA-256 check (properties 3, 7)", _load_without_checking),
}


def apply(name: str, mp: pytest.MonkeyPatch) -> str:
    if name not in MUTANTS:
        raise pytest.UsageError(f"unknown mutant {name!r}; known: {sorted(MUTANTS)}")
    description, mutate = MUTANTS[name]
    mutate(mp)
    return description
