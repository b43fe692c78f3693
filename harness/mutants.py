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
    import pieceworks.dispatch as dispatch
    import pieceworks.runtime as runtime

    def padded(sizes, batch):
        i = bisect.bisect_right(sizes, batch)
        return sizes[i - 1] if i > 0 and sizes[i - 1] >= batch else (sizes[i] if i < len(sizes) else None)

    def wrong(sizes, batch):  # one size too far: correct only when the batch is exactly a captured size
        i = bisect.bisect_left(sizes, batch)
        return sizes[i] if i < len(sizes) and sizes[i] == batch else (sizes[i - 1] if i > 0 else padded(sizes, batch))

    mp.setattr(dispatch, "padded_size", wrong)
    mp.setattr(runtime, "padded_size", wrong)


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


def _plan_ignores_moved_inputs(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.plan as plan

    original = plan._replay_step
    mp.setattr(plan, "_replay_step", lambda replay, moved: original(replay, []))


def _plan_checks_no_caller_inputs(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.plan as plan

    original = plan.ReplayPlan.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self.cheap_checks = []

    mp.setattr(plan.ReplayPlan, "__init__", init)


def _rebinding(mp: pytest.MonkeyPatch, change: Callable) -> None:
    import pieceworks.binding as binding
    import pieceworks.runtime as runtime

    original = binding.bind

    def bind(model, placeholders, example_inputs, call_args, *rest):
        found = original(model, placeholders, example_inputs, call_args, *rest)
        if isinstance(found, binding.Binder):
            found.sources = [change(kind, value, call_args) for kind, value in found.sources]
        return found

    mp.setattr(runtime, "bind", bind)


def _parameters_bound_by_value(mp: pytest.MonkeyPatch) -> None:
    _rebinding(mp, lambda kind, value, args: (kind, value.detach().clone()) if kind == 2 else (kind, value))


def _batch_size_from_the_trace(mp: pytest.MonkeyPatch) -> None:
    def change(kind, value, args):
        return (2, next(a.shape[0] for a in args if hasattr(a, "shape"))) if kind == 1 else (kind, value)

    _rebinding(mp, change)


def _always_through_dynamo(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.runtime as runtime

    mp.setattr(runtime, "bind", lambda *args: "mutant: never bound")


def _outputs_flat(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.binding as binding

    mp.setattr(binding.Binder, "outputs", lambda self, flat: flat)
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
    "plan_ignores_moved_inputs": ("a replay plan never copies a splitting op's fresh output to the captured address "
                                  "(test_runtime, test_cudagraph_gpu)", _plan_ignores_moved_inputs),
    "plan_checks_no_caller_inputs": ("a replay plan checks no caller-owned input address (test_runtime)",
                                     _plan_checks_no_caller_inputs),
    "parameters_bound_by_value": ("direct calls bind copies of the parameters (test_runtime)",
                                  _parameters_bound_by_value),
    "batch_size_from_the_trace": ("direct calls pass the tracing call's batch size for SymInt inputs (test_runtime)",
                                  _batch_size_from_the_trace),
    "always_through_dynamo": ("every call goes through Dynamo (test_compile, test_runtime)", _always_through_dynamo),
    "outputs_flat": ("direct calls return the graph's flat outputs (test_runtime)", _outputs_flat),
}


def apply(name: str, mp: pytest.MonkeyPatch) -> str:
    if name not in MUTANTS:
        raise pytest.UsageError(f"unknown mutant {name!r}; known: {sorted(MUTANTS)}")
    description, mutate = MUTANTS[name]
    mutate(mp)
    return description
