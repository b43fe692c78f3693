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


# ---- the reference core where users break it (issue 7: items 1, 3, 4, 6, 11, 12, 13, 15) ----
def _piece_args_from_a_fake_rerun(mp: pytest.MonkeyPatch) -> None:
    import torch

    import pieceworks.backend as backend

    original = backend._traced_args

    def rerun(item):  # what the backend did before: derive piece arguments by running under the trace's fake mode
        args = original(item)
        fake_mode = next(a.fake_mode for a in args if hasattr(a, "fake_mode"))
        with fake_mode:
            torch.fx.Interpreter(item.graph).run(*args)
        return args

    mp.setattr(backend, "_traced_args", rerun)


def _unbacked_size_bound_in_its_reader(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.split as split

    mp.setattr(split, "binds_unbacked_size", lambda node: False)


def _static_compiles_of_data_dependent_pieces(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.backend as backend

    mp.setattr(backend, "data_dependent_sizes", lambda gm: [])


def _data_dependent_pieces_captured(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.capturability as capturability

    mp.setattr(capturability, "data_dependent_sizes", lambda gm: [])


def _splitting_ops_unchecked(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.backend as backend

    mp.setattr(backend, "check_splitting_ops", lambda ops: None)


def _absent_splitting_ops_silent(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.backend as backend

    mp.setattr(backend, "absent_splitting_ops", lambda gm, ops: [])


def _inductor_keys_unchecked(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.config as config

    mp.setattr(config, "_check_inductor_keys", lambda keys: None)


def _config_not_frozen(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.config as config

    mp.setattr(config.CompilationConfig, "freeze", lambda self: self)


def _config_shared_not_copied(mp: pytest.MonkeyPatch) -> None:
    import types

    import pieceworks.backend as backend

    mp.setattr(backend, "copy", types.SimpleNamespace(deepcopy=lambda value: value))


def _capture_sizes_stop_below_the_limit(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.config as config

    def sizes(max_size=512):
        return [s for s in [1, 2, 4, *range(8, 256, 8), *range(256, max_size + 1, 16)] if s <= max_size]

    mp.setattr(config, "default_capture_sizes", sizes)


def _empty_capture_sizes_accepted(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.config as config

    mp.setattr(config, "_check_something_to_capture", lambda mode, sizes: None)


def _compile_sizes_shorthand_unknown(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.config as config

    mp.setattr(config.CompilationConfig, "_expand_compile_sizes",
               lambda self: sorted(set(config._check_int_list("compile_sizes", self.compile_sizes))))


def _unsplit_piecewise_runs_without_graphs(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.graph as graph

    original = graph.PiecewiseGraph._effective_mode

    def effective(self, mode, example_inputs):
        chosen = original(self, mode, example_inputs)
        split = any(i.is_splitting_graph for i in self.items)
        return graph.CUDAGraphMode.NONE if chosen is graph.CUDAGraphMode.PIECEWISE and not split else chosen

    mp.setattr(graph.PiecewiseGraph, "_effective_mode", effective)


def _graph_mode_dropped_quietly(mp: pytest.MonkeyPatch) -> None:
    import types

    import pieceworks.graph as graph

    log = graph.log
    mp.setattr(graph, "log", types.SimpleNamespace(info=log.info, warning=log.info, debug=log.debug, error=log.error))


MUTANTS: dict[str, tuple[str, Callable[[pytest.MonkeyPatch], None]]] = {
    "piece_args_from_a_fake_rerun": ("piece arguments are re-derived under the fake mode, leaving unbacked symbols "
                                     "pending (issue 7.1)", _piece_args_from_a_fake_rerun),
    "unbacked_size_bound_in_its_reader": ("a splitting op's data-dependent size is bound in the piece that reads it "
                                          "(issue 7.1)", _unbacked_size_bound_in_its_reader),
    "static_compiles_of_data_dependent_pieces": ("pieces with data-dependent sizes get static compiles (issue 7.1)",
                                                 _static_compiles_of_data_dependent_pieces),
    "data_dependent_pieces_captured": ("pieces with data-dependent sizes are captured in CUDA graphs (issue 7.1)",
                                       _data_dependent_pieces_captured),
    "splitting_ops_unchecked": ("splitting ops naming no registered op are accepted (issue 7.3)",
                                _splitting_ops_unchecked),
    "absent_splitting_ops_silent": ("splitting ops the graph never calls go unreported (issue 7.3)",
                                    _absent_splitting_ops_silent),
    "inductor_keys_unchecked": ("unknown inductor_compile_config keys are accepted (issue 7.4)",
                                _inductor_keys_unchecked),
    "config_not_frozen": ("a compiled config can still be edited (issue 7.6)", _config_not_frozen),
    "config_shared_not_copied": ("compiled models use the caller's config object itself (issue 7.6)",
                                 _config_shared_not_copied),
    "capture_sizes_stop_below_the_limit": ("default capture sizes end at the stride step below an off-stride "
                                           "max_num_batched_tokens (issue 7.12)", _capture_sizes_stop_below_the_limit),
    "empty_capture_sizes_accepted": ("a graph mode with no capture size is accepted (issue 7.13)",
                                     _empty_capture_sizes_accepted),
    "compile_sizes_shorthand_unknown": ('compile_sizes=["cudagraph_capture_sizes"] is rejected (issue 7.13)',
                                        _compile_sizes_shorthand_unknown),
    "unsplit_piecewise_runs_without_graphs": ("PIECEWISE on a graph with no splitting op captures nothing "
                                              "(issue 7.11)", _unsplit_piecewise_runs_without_graphs),
    "graph_mode_dropped_quietly": ("a graph mode that becomes NONE is logged at INFO (issue 7.15)",
                                   _graph_mode_dropped_quietly),
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
