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

    original = split.assign_pieces

    def assign(gm, ops):
        piece_of, splitting = original(gm, ops)
        for node in piece_of:
            if node.target is operator.getitem and piece_of[node] in splitting:
                piece_of[node] += 1
        return piece_of, splitting

    mp.setattr(split, "assign_pieces", assign)


def _index_without_checksum(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.cache as cache

    mp.setattr(cache, "entries_digest", lambda entries: "unchecked")


def _key_ignores_config(mp: pytest.MonkeyPatch) -> None:
    _key_without("config")(mp)


def _pad_to_the_size_below(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.api as api
    import pieceworks.dispatch as dispatch

    def padded(sizes, batch):
        i = bisect.bisect_right(sizes, batch)
        return sizes[i - 1] if i > 0 and sizes[i - 1] >= batch else (sizes[i] if i < len(sizes) else None)

    def wrong(sizes, batch):  # one size too far: correct only when the batch is exactly a captured size
        i = bisect.bisect_left(sizes, batch)
        return sizes[i] if i < len(sizes) and sizes[i] == batch else (sizes[i - 1] if i > 0 else padded(sizes, batch))

    for module in (dispatch, api):  # where it is defined and where CompiledModel calls it
        mp.setattr(module, "padded_size", wrong)


def _static_copy_misses_last_row(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.padding as padding

    original = padding.StaticInputs.load

    def load(self, args, batch):
        if batch > 1:  # the real rows but the last
            original(self, [a[: batch - 1] if hasattr(a, "shape") else a for a in args], batch - 1)

    mp.setattr(padding.StaticInputs, "load", load)


def _load_without_checking(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.cache as cache

    def load(self, name, loader, claim=None, skip=None):
        entry = self.read_index().get(name)
        if entry is None or entry == skip:
            return None, entry
        try:
            return loader(os.path.join(self.artifact_dir, entry["file"])), entry
        except Exception:  # noqa: BLE001
            return None, entry

    mp.setattr(cache.CompileCache, "load", load)


def _plan_ignores_moved_inputs(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.plan as plan

    original = plan.replay_step
    mp.setattr(plan, "replay_step", lambda graph, moved: original(graph, []))


def _plan_checks_no_caller_inputs(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.plan as plan

    original = plan.ReplayPlan.__init__

    def init(self, batch, steps, num_slots, output, cheap_checks, *rest):
        original(self, batch, steps, num_slots, output, [], *rest)

    mp.setattr(plan.ReplayPlan, "__init__", init)


def _rebinding(mp: pytest.MonkeyPatch, change: Callable) -> None:
    import pieceworks.api as api
    import pieceworks.binding as binding

    original = binding.bind

    def bind(model, placeholders, example_inputs, call_args, *rest):
        found = original(model, placeholders, example_inputs, call_args, *rest)
        if isinstance(found, binding.Binder):
            found.sources = [change(kind, value, call_args) for kind, value in found.sources]
        return found

    mp.setattr(api, "bind", bind)


def _parameters_bound_by_value(mp: pytest.MonkeyPatch) -> None:
    _rebinding(mp, lambda kind, value, args: (kind, value.detach().clone()) if kind == 2 else (kind, value))


def _batch_size_from_the_trace(mp: pytest.MonkeyPatch) -> None:
    def change(kind, value, args):
        return (2, next(a.shape[0] for a in args if hasattr(a, "shape"))) if kind == 1 else (kind, value)

    _rebinding(mp, change)


def _always_through_dynamo(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.api as api

    mp.setattr(api, "bind", lambda *args: "mutant: never bound")


def _outputs_flat(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.binding as binding

    mp.setattr(binding.Binder, "outputs", lambda self, flat: flat)


# ---- harness power: argument checks, pool and capture order, addresses, padding, writes, outputs ----
def _arg_check_skips_dtype(mp: pytest.MonkeyPatch) -> None:
    import torch

    import pieceworks.api as api

    original = api.signature
    # a tensor's dtype is never compared: any dtype passes as the first call's
    mp.setattr(api, "signature", lambda a: (None, *original(a)[1:]) if isinstance(a, torch.Tensor) else original(a))


def _capture_smallest_first(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.runtime as runtime

    mp.setattr(runtime, "capture_order", lambda sizes: sorted(set(sizes)))


def _capture_keeps_outputs(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.plan as plan

    mp.setattr(plan, "non_owning_alias", lambda value: value)  # FULL graphs and plans own each size's outputs


def _wrap_replays(mp: pytest.MonkeyPatch, wrap: Callable) -> None:
    """`wrap(outputs, owner)` applied to what every replay (FULL graph or PIECEWISE plan) returns."""
    import pieceworks.plan as plan

    original = plan.ReplayPlan.run
    mp.setattr(plan.ReplayPlan, "run", lambda self, args, checks=(): wrap(original(self, args, checks), self))


def _replay_leaks_outputs(mp: pytest.MonkeyPatch) -> None:
    from pieceworks.values import tensors_in

    def leak(out, owner):
        owner.__dict__.setdefault("_history", []).append([t.clone() for t in tensors_in(out)])
        return out

    _wrap_replays(mp, leak)


def _checks_parameters_not_split_outputs(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.plan as plan

    original = plan.ReplayPlan.__init__

    def init(self, batch, steps, num_slots, output, cheap_checks, all_checks, *rest):
        # check what only debug mode checks (parameters), not what can move
        original(self, batch, steps, num_slots, output, [c for c in all_checks if c not in cheap_checks], all_checks,
                 *rest)

    mp.setattr(plan.ReplayPlan, "__init__", init)
    replay = plan.replay_step
    mp.setattr(plan, "replay_step", lambda graph, moved: replay(graph, []))  # fresh split outputs: unchecked


def _unpad_with(cut: Callable) -> Callable:
    import torch

    def unpad(value, batch, n, batched=None):  # the shape rule, ignoring the trace's marks
        if isinstance(value, torch.Tensor):
            return cut(value, batch, n) if value.dim() > 0 and value.shape[0] == n else value
        if isinstance(value, (tuple, list)):
            return type(value)(unpad(v, batch, n) for v in value)
        return value

    return unpad


def _unpad_top_level_only(mp: pytest.MonkeyPatch) -> None:
    import torch

    import pieceworks.api as api

    def unpad(value, batch, n, batched=None):  # the shape rule, ignoring the trace's marks
        if isinstance(value, (tuple, list)):
            return type(value)(v[:batch] if isinstance(v, torch.Tensor) and v.dim() and v.shape[0] == n else v
                               for v in value)
        return value[:batch] if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == n else value

    mp.setattr(api, "unpad", unpad)


def _unpad_keeps_the_tail(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.api as api

    mp.setattr(api, "unpad", _unpad_with(lambda t, batch, n: t[n - batch:]))


def _outputs_alias_freed_memory(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.api as api
    from pieceworks.cudagraph import non_owning_alias

    mp.setattr(api, "unpad", _unpad_with(lambda t, batch, n: non_owning_alias(t[:batch].clone())))


def _replay_copies_outputs(mp: pytest.MonkeyPatch) -> None:
    from pieceworks.values import tree_map

    _wrap_replays(mp, lambda out, owner: tree_map(lambda v: v.clone() if hasattr(v, "clone") else v, out))


def _static_buffers_uninitialised(mp: pytest.MonkeyPatch) -> None:
    import torch

    import pieceworks.padding as padding

    original = padding.StaticInputs.__init__

    def init(self, example_args, max_size):
        original(self, example_args, max_size)
        for buffer, a in zip(self.buffers, example_args):
            if isinstance(a, torch.Tensor):
                buffer.view(torch.uint8).fill_(0x7F)  # what a reused block may hold: huge ids and floats
                buffer[: a.shape[0]].copy_(a)

    mp.setattr(padding.StaticInputs, "__init__", init)


def _no_copy_back_of_inplace_writes(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.padding as padding

    mp.setattr(padding.StaticInputs, "copy_back", lambda self, args, batch, positions: None)


def _warmup_writes_twice(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.cudagraph as cudagraph

    original = cudagraph.CapturePool.capture
    # nothing saved before the warm-ups, nothing put back before the capture
    mp.setattr(cudagraph.CapturePool, "capture", lambda self, fn, args, mutated: original(self, fn, args, []))


def _unpad_cuts_every_n_rows(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.api as api

    # no marks from the trace: every tensor whose dim 0 equals the padded size is cut, a [n] weight included
    mp.setattr(api, "batched_outputs", lambda output, is_batched: None)


def _unpad_skips_namedtuples(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.padding as padding

    original = padding.container_items
    mp.setattr(padding, "container_items", lambda value: None if hasattr(value, "_fields") else original(value))


def _first_call_runs_twice(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.api as api

    original = api.CompiledModel.__call__

    def call(self, *args):
        if self.runtime is None:
            original(self, *args)  # the tracing run, then the call again
        return original(self, *args)

    mp.setattr(api.CompiledModel, "__call__", call)


def _trace_writes_not_restored(mp: pytest.MonkeyPatch) -> None:
    import dataclasses

    import pieceworks.api as api

    original = api.compile_graph
    # the graph's in-place writes are not known, so nothing is saved before a tracing run on copies, nor put back
    mp.setattr(api, "compile_graph", lambda gm, config: dataclasses.replace(original(gm, config), mutated_inputs=()))


def _value_check_ignores_type(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.api as api

    original = api.signature
    mp.setattr(api, "signature", lambda a: ("value", object, a) if original(a)[0] == "value" else original(a))


def _capture_snapshots_weights(mp: pytest.MonkeyPatch) -> None:
    import torch

    import pieceworks.cudagraph as cudagraph

    original = cudagraph.CapturePool.capture

    def capture(self, fn, args, mutated):
        snapshot = [a.clone() if isinstance(a, torch.nn.Parameter) else a for a in args]
        self.__dict__.setdefault("_snapshots", []).append(snapshot)  # graphs read these copies from now on
        return original(self, fn, snapshot, mutated)

    mp.setattr(cudagraph.CapturePool, "capture", capture)


def _empty_pieces_through_inductor(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.compiler as compiler

    mp.setattr(compiler, "computes_tensors", lambda piece: True)


def _loads_start_compile_workers(mp: pytest.MonkeyPatch) -> None:
    import torch

    import pieceworks.compiler as compiler

    def load(path, gm):  # the artifact loaded under the user's compile_threads: Inductor starts its worker pool
        artifact = torch._inductor.CompiledArtifact.load(path=path, format="binary")
        tuple_output = isinstance(next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0],
                                  (tuple, list))

        def call(*args):
            out = artifact(*args)
            return tuple(out) if tuple_output else (out[0] if isinstance(out, (list, tuple)) else out)

        return call

    mp.setattr(compiler, "load_artifact", load)


def _timing_not_interleaved(mp: pytest.MonkeyPatch) -> None:
    from pieceworks.harness import timing

    original = timing.interleaved_cuda_time_us

    def one_after_another(fns, warmup=20, reps=200, rounds=10):
        return {name: original({name: fn}, warmup=warmup, reps=reps, rounds=rounds)[name] for name, fn in fns.items()}

    mp.setattr(timing, "interleaved_cuda_time_us", one_after_another)


def _report_hides_what_the_split_costs(mp: pytest.MonkeyPatch) -> None:
    from pieceworks.harness.report import Report

    mp.setattr(Report, "UNSPLIT", "not timed")


def _report_hides_later_warm_starts(mp: pytest.MonkeyPatch) -> None:
    from pieceworks.harness.report import Report

    mp.setattr(Report, "_warm_start_runs", lambda self: ([], [], []))


# ---- CI: the benchmark gate and the preflight ----
def _gate_ignores_controls(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.gate.verdicts as verdicts

    mp.setattr(verdicts, "_with_drift", lambda rows, thresholds: rows)


def _report_ignores_side_by_side_profiles(mp: pytest.MonkeyPatch) -> None:
    from pieceworks.harness import report

    mp.setattr(report.Report, "_side_by_side", lambda self, dtype, batch, impls: None)


def _report_hides_where_the_first_call_went(mp: pytest.MonkeyPatch) -> None:
    from pieceworks.harness import report

    mp.setattr(report.Report, "_first_call_parts", staticmethod(lambda entry, first_call: (None, None, None)))


def _report_hides_the_capture_cost(mp: pytest.MonkeyPatch) -> None:
    from pieceworks.harness import report

    mp.setattr(report.Report, "_capture_note", lambda self, mode: "")


def _report_latency_ratio_ignores_rounds(mp: pytest.MonkeyPatch) -> None:
    from pieceworks.harness import report

    mp.setattr(report.Report, "_latency_ratio",
               staticmethod(lambda in_rounds, top, bottom: (top / bottom if top and bottom else None, None)))


def _code_size_counts_docstrings(mp: pytest.MonkeyPatch) -> None:
    from pieceworks.harness import code_size

    mp.setattr(code_size, "_docstring_lines", lambda source: set())


def _report_hides_the_kernel_difference(mp: pytest.MonkeyPatch) -> None:
    from pieceworks.harness import profile

    mp.setattr(profile, "kernels_only_in", lambda first, second, limit=3: [])



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


def _gate_incomplete_hides_regression(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.gate as gate
    import pieceworks.gate.verdicts as verdicts

    def exit_status(rows):
        found = {r.verdict for r in rows}
        return 2 if found & verdicts.INCOMPLETE else 1 if found & verdicts.REGRESSION else 0

    mp.setattr(verdicts, "exit_status", exit_status)
    mp.setattr(gate, "exit_status", exit_status)


def _gate_noise_fails_unchanged(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.gate.verdicts as verdicts

    original = verdicts.judge

    def judge(base, head, thresholds, unit, *sets):
        verdict, ratio, threshold, metric, note = original(base, head, thresholds, unit, *sets)
        rule = thresholds.rule_for(base.benchmark, unit)
        if verdict == verdicts.OK and threshold is not None and threshold > rule.max_noise:
            verdict = verdicts.TOO_NOISY
        return verdict, ratio, threshold, metric, note

    mp.setattr(verdicts, "judge", judge)


def _conformance_nothing_ran_passes(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.harness.pytest_plugin as plugin

    mp.setattr(plugin, "nothing_ran", lambda results: None)


def _replaced_state_served(mp: pytest.MonkeyPatch) -> None:
    import types

    import pieceworks.api as api

    mp.setattr(api, "StateWatch", lambda model, owner: types.SimpleNamespace(replaced=None))


def _reallocation_unseen(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.binding as binding

    mp.setattr(binding, "after_apply", lambda module, callback: None)


def _layout_passed_through(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.api as api

    mp.setattr(api, "contiguous", list)


def _no_progress_bar(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.backend as backend
    import pieceworks.runtime as runtime

    for module in (backend, runtime):
        mp.setattr(module, "progress", lambda items, description, total=None: items)


def _clock_skips_the_device(mp: pytest.MonkeyPatch) -> None:
    import time

    import pieceworks.harness.timing as timing

    mp.setattr(timing, "synchronized_clock", time.perf_counter)


def _events_per_launch(mp: pytest.MonkeyPatch) -> None:
    import time

    import pieceworks.harness.timing as timing

    def host_clock_samples(fn, reps, calls=1):  # a host clock around asynchronous launches
        samples = []
        for _ in range(reps):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter() - start) * 1e6 / calls)
        return samples

    mp.setattr(timing, "_event_samples_us", host_clock_samples)


def _pool_reading_counts_every_pool(mp: pytest.MonkeyPatch) -> None:
    import torch

    import pieceworks.harness.memory as memory

    mp.setattr(memory, "pool_bytes", lambda pool: sum(s["total_size"] for s in torch.cuda.memory_snapshot()
                                                      if tuple(s.get("segment_pool_id", ())) != (0, 0)))


def _capture_sizes_skip_one(mp: pytest.MonkeyPatch) -> None:
    from hypothesis import strategies as st

    import pieceworks.harness.strategies as strategies

    mp.setattr(strategies, "capture_sizes", lambda max_size=64, max_count=12: st.lists(
        st.integers(2, max_size), min_size=1, max_size=max_count, unique=True).map(sorted))


def _batches_never_beyond(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.harness.strategies as strategies

    original = strategies.batch_sequences
    mp.setattr(strategies, "batch_sequences", lambda max_size=64, beyond=16, max_len=12: original(max_size, 0, max_len))


def _adapter_counts_the_session(mp: pytest.MonkeyPatch) -> None:
    import dataclasses

    import pieceworks
    import pieceworks.harness.implementations as impls

    original = impls.Pieceworks.build

    def build(self, *args, **kwargs):
        before = pieceworks.counters.num_inductor_compiles + pieceworks.counters.num_eager_compiles
        built = original(self, *args, **kwargs)
        return dataclasses.replace(built, compiles=built.compiles + before)

    mp.setattr(impls.Pieceworks, "build", build)


def _gate_drift_per_benchmark(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.gate.verdicts as verdicts

    original = verdicts.params_of
    mp.setattr(verdicts, "params_of", lambda text: {k: v for k, v in original(text).items() if k == "implementation"})


def _report_always_committed(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.harness.report as report

    mp.setattr(report, "result_files_source", lambda paths, results: "the committed result files")


def _demo_leaves_its_folder(mp: pytest.MonkeyPatch) -> None:
    import contextlib
    import tempfile
    import types

    import pieceworks.harness.demo as demo

    @contextlib.contextmanager
    def kept(prefix: str = "tmp", **_: object):
        yield tempfile.mkdtemp(prefix=prefix)

    mp.setattr(demo, "tempfile", types.SimpleNamespace(TemporaryDirectory=kept, mkdtemp=tempfile.mkdtemp))


def _report_unmeasured_as_method_text(mp: pytest.MonkeyPatch) -> None:
    from pieceworks.harness import report

    mp.setattr(report.Report, "_not_measured", lambda self, title, reason: self.lines.extend(
        [f"## {title}", "", "Median µs per forward, CUDA events.", ""]))


def _gate_improvements_fail(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.gate.verdicts as verdicts

    original = verdicts.judge

    def judge(*args, **kwargs):
        verdict, *rest = original(*args, **kwargs)
        return (verdicts.REGRESSED if verdict == verdicts.IMPROVED else verdict, *rest)

    mp.setattr(verdicts, "judge", judge)


def _ignore_preflight_check(mp: pytest.MonkeyPatch, check: str) -> None:
    import dataclasses

    import pieceworks.harness.preflight as preflight

    original = preflight.assess

    def assess(readings, limits):
        return [dataclasses.replace(f, ok=True) if f.check == check else f for f in original(readings, limits)]

    mp.setattr(preflight, "assess", assess)


def _preflight_ignores_other_processes(mp: pytest.MonkeyPatch) -> None:
    _ignore_preflight_check(mp, "other processes")


def _preflight_ignores_the_clock(mp: pytest.MonkeyPatch) -> None:
    _ignore_preflight_check(mp, "SM clock under load")


# ---- the reference core where users break it ----
def _piece_args_from_a_fake_rerun(mp: pytest.MonkeyPatch) -> None:
    import torch

    import pieceworks.piece as piece

    original = piece.traced_args

    def rerun(graph):  # what the backend did before: derive piece arguments by running under the trace's fake mode
        args = original(graph)
        fake_mode = next(a.fake_mode for a in args if hasattr(a, "fake_mode"))
        with fake_mode:
            torch.fx.Interpreter(graph).run(*args)
        return args

    mp.setattr(piece, "traced_args", rerun)


def _unbacked_size_bound_in_its_reader(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.split as split

    mp.setattr(split, "binds_unbacked_size", lambda node: False)


def _static_compiles_of_data_dependent_pieces(mp: pytest.MonkeyPatch) -> None:
    import dataclasses

    import pieceworks.compiler as compiler

    original = compiler.PieceCompiler.compile
    mp.setattr(compiler.PieceCompiler, "compile",
               lambda self, piece: original(self, dataclasses.replace(piece, unbacked_symbols=())))


def _data_dependent_pieces_captured(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.piece as piece

    original = piece.uncapturable_reason

    def reason(gm, example_args):
        found = original(gm, example_args)
        return None if found is not None and found.startswith("its sizes depend on data") else found

    mp.setattr(piece, "uncapturable_reason", reason)


def _splitting_ops_unchecked(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.backend as backend

    mp.setattr(backend, "check_splitting_ops", lambda ops: None)


def _absent_splitting_ops_silent(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.backend as backend

    mp.setattr(backend, "absent_splitting_ops", lambda gm, ops: [])


def _inductor_keys_unchecked(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.config as config

    mp.setattr(config, "check_inductor_keys", lambda keys: None)


def _config_not_frozen(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.config as config

    mp.setattr(config.CompilationConfig, "freeze", lambda self: self)


def _config_shared_not_copied(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.api as api
    import pieceworks.backend as backend

    for module in (api, backend):
        mp.setattr(module, "own_config", lambda config: config.freeze() if config is not None else
                   backend.CompilationConfig().freeze())


def _capture_sizes_stop_below_the_limit(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.config as config

    def sizes(max_size=512):
        return [s for s in [1, 2, 4, *range(8, 256, 8), *range(256, max_size + 1, 16)] if s <= max_size]

    mp.setattr(config, "default_capture_sizes", sizes)


def _empty_capture_sizes_accepted(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.config as config

    mp.setattr(config, "check_something_to_capture", lambda mode, sizes: None)


def _compile_sizes_shorthand_unknown(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.config as config

    mp.setattr(config, "CAPTURE_SIZES_SHORTHAND", "capture_sizes")  # vLLM's spelling is then an unknown entry


def _unsplit_piecewise_runs_without_graphs(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.runtime as runtime

    original = runtime.effective_mode

    def effective(config, graph):
        chosen = original(config, graph)
        split = any(p.is_splitting_graph for p in graph.pieces)
        return runtime.CUDAGraphMode.NONE if chosen is runtime.CUDAGraphMode.PIECEWISE and not split else chosen

    mp.setattr(runtime, "effective_mode", effective)


def _graph_mode_dropped_quietly(mp: pytest.MonkeyPatch) -> None:
    import types

    import pieceworks.runtime as runtime

    log = runtime.log
    mp.setattr(runtime, "log", types.SimpleNamespace(info=log.info, warning=log.info, debug=log.debug,
                                                     error=log.error))


# ---- benchmarks: the implementation registry and the host-overhead breakdown ----
def _resolve_returns_the_class(mp: pytest.MonkeyPatch) -> None:
    import importlib

    import pieceworks.harness.implementations as impls

    original = impls.resolve

    def resolve(spec):
        if spec not in impls.IMPLEMENTATIONS and ":" in spec:
            module, _, attr = spec.partition(":")
            return getattr(importlib.import_module(module), attr)  # a subclass comes back uninstantiated
        return original(spec)

    mp.setattr(impls, "resolve", resolve)


def _user_implementations_not_registered(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.harness.implementations as impls

    mp.setattr(impls, "register", lambda impl: impl)


def _pcg_always_available(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.harness.implementations as impls

    mp.setattr(impls.MetaPCG, "unavailable_reason", impls.Implementation.unavailable_reason)


def _pcg_pads_to_the_size_below(mp: pytest.MonkeyPatch) -> None:
    import types

    import pieceworks.harness.implementations as impls

    below = types.SimpleNamespace(bisect_left=lambda a, x: max(bisect.bisect_left(a, x) - 1, 0))
    mp.setattr(impls, "bisect", below)


def _breakdown_drops_splitting_ops(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.harness.breakdown as breakdown

    original = breakdown.record

    def record(compiled, args):
        out, work = original(compiled, args)
        return out, [w for w in work if not w.splitting]

    mp.setattr(breakdown, "record", record)



# ---- the compile cache -------------------------------------------------
def _unusable_cache_raises(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.cache as cache

    mp.setattr(cache.CompileCache, "open", classmethod(lambda cls, root, key, factors=None: cls(root, key, factors)))


def _read_only_cache_raises(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.cache as cache

    def read_only(self, exc):
        raise exc

    mp.setattr(cache.CompileCache, "mark_read_only", read_only)


def _index_warns_every_read(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.cache as cache

    def read_index(self):
        try:
            with open(self.index_path, "rb") as f:
                return cache.parse_index(f.read())
        except FileNotFoundError:
            return {}
        except (OSError, cache.CacheIndexError) as exc:
            cache.log.warning("pieceworks cache index %s is unreadable (%s)", self.index_path, exc)
            return {}

    mp.setattr(cache.CompileCache, "read_index", read_index)


def _prune_by_age_only(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.cache as cache

    original = cache.prune
    mp.setattr(cache, "prune", lambda root, older_than_days=None, environment=None: original(root, older_than_days))


def _wrong_types_not_replaced(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.cache as cache

    mp.setattr(cache.CompileCache, "replace_corrupt", lambda self, path, what: None)


def _load_ignores_claims(mp: pytest.MonkeyPatch) -> None:
    import hashlib

    import pieceworks.cache as cache

    def load(self, name, loader, claim=None, skip=None):  # the SHA-256 check only, as before entries carried claims
        entry = self.read_index().get(name)
        if entry is None or entry == skip:
            return None, entry
        path = os.path.join(self.artifact_dir, entry["file"])
        try:
            with open(path, "rb") as f:
                data = f.read()
            if (hashlib.sha256(data).hexdigest(), len(data)) != (entry["sha256"], entry["bytes"]):
                return None, entry
            return loader(path), entry
        except Exception:  # noqa: BLE001
            return None, entry

    mp.setattr(cache.CompileCache, "load", load)


def _patch_cache_factors(mp: pytest.MonkeyPatch, change: Callable) -> None:
    """`change(factors)` applied to the cache factors, where the backend computes them and where tests do."""
    import pieceworks.backend as backend
    import pieceworks.key as key

    original = key.cache_factors
    for module in (key, backend):
        mp.setattr(module, "cache_factors", lambda *args: change(original(*args)))


def _key_without(factor: str) -> Callable[[pytest.MonkeyPatch], None]:
    def mutate(mp: pytest.MonkeyPatch) -> None:
        _patch_cache_factors(mp, lambda found: {k: v for k, v in found.items() if k != factor})

    return mutate


def _key_ignores_torch_git(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.key as key

    original = key.software_factors
    mp.setattr(key, "software_factors", lambda: {k: v for k, v in original().items() if k != "git"})


def _fingerprint_ignores_strides(mp: pytest.MonkeyPatch) -> None:
    import torch

    import pieceworks.key as key

    original = key.describe_value

    def describe(value):
        if isinstance(value, torch.Tensor):
            return f"T({tuple(map(str, value.shape))},{value.dtype},{value.device.type})"
        return original(value)

    mp.setattr(key, "describe_value", describe)


def _key_includes_working_directory(mp: pytest.MonkeyPatch) -> None:
    _patch_cache_factors(mp, lambda found: {**found, "cwd": os.getcwd()})


def _fingerprint_ignores_constants(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.key as key

    mp.setattr(key, "constant_text", lambda value: "number" if isinstance(value, (int, float)) else repr(value))


def _no_entry_lock(mp: pytest.MonkeyPatch) -> None:
    import contextlib

    import pieceworks.cache as cache

    mp.setattr(cache.CompileCache, "entry_lock", lambda self, name: contextlib.nullcontext())


def _store_without_index_lock(mp: pytest.MonkeyPatch) -> None:
    import contextlib

    import pieceworks.cache as cache

    original = cache.CompileCache.index_lock
    mp.setattr(cache.CompileCache, "index_lock",
               lambda self, exclusive: contextlib.nullcontext() if exclusive else original(self, exclusive))


def _index_written_in_place(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.cache as cache

    def write(path, data):
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), "wb") as f:
            f.write(data)

    mp.setattr(cache, "atomic_write", write)


def _inductor_cache_not_carried(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.cache as cache

    mp.setattr(cache.CompileCache, "inductor_dir", property(lambda self: None))


def _backend_compilations_count_fresh_compiles(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.compiler as compiler
    from pieceworks.counters import counters

    get = compiler.PieceCompiler.get

    def counted_get(self, *args):  # the old meaning: only fresh compiles count
        before, compiled = counters.num_backend_compilations, self.compiled
        fn = get(self, *args)
        counters.num_backend_compilations = before + self.compiled - compiled
        return fn

    mp.setattr(compiler.PieceCompiler, "get", counted_get)


def _inductor_options_ignored(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.compiler as compiler

    original = compiler.compile_inductor
    mp.setattr(compiler, "compile_inductor",
               lambda gm, args, *, static, inductor_config: original(gm, args, static=static, inductor_config={}))


MUTANTS: dict[str, tuple[str, Callable[[pytest.MonkeyPatch], None]]] = {
    "unusable_cache_raises": ("an unusable cache directory raises instead of warning once",
                              _unusable_cache_raises),
    "read_only_cache_raises": ("a read-only cache raises instead of loading what is valid",
                               _read_only_cache_raises),
    "wrong_types_not_replaced": ("a folder where the cache expects a file (or the reverse) is left in place",
        _wrong_types_not_replaced),
    "load_ignores_claims": ("an entry loads whatever piece it claims and whatever file it names",
                            _load_ignores_claims),
    "key_ignores_inductor_config": ("the key leaves out the global Inductor/functorch config",
                                    _key_without("inductor")),
    "key_ignores_torch_git": ("the key leaves out torch's git hash", _key_ignores_torch_git),
    "fingerprint_ignores_strides": ("graph fingerprints leave out input strides",
                                    _fingerprint_ignores_strides),
    "key_includes_working_directory": ("the key includes the working directory, a per-run value",
                                       _key_includes_working_directory),
    "fingerprint_ignores_constants": ("fingerprints see x*2 and x*3 as one piece",
                                      _fingerprint_ignores_constants),
    "no_entry_lock": ("cold processes do not take turns on an entry: each compiles everything",
                      _no_entry_lock),
    "store_without_index_lock": ("writers merge the index without its lock", _store_without_index_lock),
    "index_written_in_place": ("the index is rewritten in place, not via a temporary file and a rename",
                               _index_written_in_place),
    "inductor_cache_not_carried": ("Inductor's cache stays outside the pieceworks cache: a new host rebuilds kernels",
        _inductor_cache_not_carried),
    "backend_compilations_count_fresh_compiles": ("num_backend_compilations counts fresh distinct compiles, not "
                                                  "vLLM's pieces x targets",
                                                  _backend_compilations_count_fresh_compiles),
    "inductor_options_ignored": ("inductor_compile_config enters the key but never reaches Inductor",
                                 _inductor_options_ignored),
    "resolve_returns_the_class": ("resolve('module:Subclass') returns the class, not an instance",
                                  _resolve_returns_the_class),
    "user_implementations_not_registered": ("load_user_implementations resolves but registers nothing",
                                            _user_implementations_not_registered),
    "pcg_always_available": ("Meta pcg's adapter claims to be available without the package", _pcg_always_available),
    "pcg_pads_to_the_size_below": ("Meta pcg's adapter replays the captured size below the batch",
                                   _pcg_pads_to_the_size_below),
    "breakdown_drops_splitting_ops": ("the host-overhead breakdown leaves the splitting pieces out",
                                      _breakdown_drops_splitting_ops),
    "piece_args_from_a_fake_rerun": ("piece arguments are re-derived under the fake mode, leaving unbacked symbols "
                                     "pending", _piece_args_from_a_fake_rerun),
    "unbacked_size_bound_in_its_reader": ("a splitting op's data-dependent size is bound in the piece that reads it",
        _unbacked_size_bound_in_its_reader),
    "static_compiles_of_data_dependent_pieces": ("pieces with data-dependent sizes get static compiles",
                                                 _static_compiles_of_data_dependent_pieces),
    "data_dependent_pieces_captured": ("pieces with data-dependent sizes are captured in CUDA graphs",
                                       _data_dependent_pieces_captured),
    "splitting_ops_unchecked": ("splitting ops naming no registered op are accepted",
                                _splitting_ops_unchecked),
    "absent_splitting_ops_silent": ("splitting ops the graph never calls go unreported",
                                    _absent_splitting_ops_silent),
    "inductor_keys_unchecked": ("unknown inductor_compile_config keys are accepted",
                                _inductor_keys_unchecked),
    "config_not_frozen": ("a compiled config can still be edited", _config_not_frozen),
    "config_shared_not_copied": ("compiled models use the caller's config object itself",
                                 _config_shared_not_copied),
    "capture_sizes_stop_below_the_limit": ("default capture sizes end at the stride step below an off-stride "
                                           "max_num_batched_tokens", _capture_sizes_stop_below_the_limit),
    "empty_capture_sizes_accepted": ("a graph mode with no capture size is accepted",
                                     _empty_capture_sizes_accepted),
    "compile_sizes_shorthand_unknown": ('compile_sizes=["cudagraph_capture_sizes"] is rejected',
                                        _compile_sizes_shorthand_unknown),
    "unsplit_piecewise_runs_without_graphs": ("PIECEWISE on a graph with no splitting op captures nothing",
        _unsplit_piecewise_runs_without_graphs),
    "graph_mode_dropped_quietly": ("a graph mode that becomes NONE is logged at INFO",
                                   _graph_mode_dropped_quietly),
    "gate_ratio_inverted": ("the gate computes base / head: slower looks faster", _gate_ratio_inverted),
    "gate_one_threshold_for_all": ("every metric gets the latency threshold (10%), pool bytes included",
                                   _gate_one_threshold_for_all),
    "gate_ignores_noise": ("the gate's threshold ignores the measured spread", _gate_ignores_noise),
    "gate_missing_is_ok": ("benchmarks missing from head are left out of the table", _gate_missing_is_ok),
    "gate_failures_pass": ("a benchmark that failed in head does not make the comparison incomplete",
                           _gate_failures_pass),
    "conformance_nothing_ran_passes": ("a conformance run in which every test was skipped exits 0",
                                       _conformance_nothing_ran_passes),
    "index_warns_every_read": ("an unreadable cache index warns at every read (once per piece)",
                               _index_warns_every_read),
    "prune_by_age_only": ("prune keeps key folders of other torch builds", _prune_by_age_only),
    "replaced_state_served": ("a replaced parameter goes unnoticed: the graphs keep the old tensor",
                              _replaced_state_served),
    "reallocation_unseen": ("model.to() that reallocates the weights goes unnoticed", _reallocation_unseen),
    "layout_passed_through": ("non-contiguous arguments reach pieces compiled for contiguous ones",
                              _layout_passed_through),
    "no_progress_bar": ("compile and capture show no progress bar on a terminal", _no_progress_bar),
    "clock_skips_the_device": ("the synchronized clock reads the time without waiting for the GPU",
                               _clock_skips_the_device),
    "events_per_launch": ("GPU calls timed with a host clock around their launches", _events_per_launch),
    "pool_reading_counts_every_pool": ("a pool's bytes count every graph pool's segments",
                                       _pool_reading_counts_every_pool),
    "capture_sizes_skip_one": ("capture-size draws never include size 1", _capture_sizes_skip_one),
    "batches_never_beyond": ("batch sequences never go above the largest capture size", _batches_never_beyond),
    "adapter_counts_the_session": ("an adapter's compile count includes earlier builds' compiles",
                                   _adapter_counts_the_session),
    "gate_drift_per_benchmark": ("the gate judges drift over a whole benchmark: a slow spell on one batch size "
                                 "reads as regressions there", _gate_drift_per_benchmark),
    "report_always_committed": ("the report says 'committed' for result files git does not track",
                                _report_always_committed),
    "demo_leaves_its_folder": ("the demo leaves its temporary folder behind", _demo_leaves_its_folder),
    "report_unmeasured_as_method_text": ("a section with no numbers shows its method text, not 'not measured here'",
                                         _report_unmeasured_as_method_text),
    "gate_incomplete_hides_regression": ("a regression exits 2 when another item is incomplete",
                                         _gate_incomplete_hides_regression),
    "gate_noise_fails_unchanged": ("an unchanged item with a wide spread is 'too noisy': identical runs fail",
                                   _gate_noise_fails_unchanged),
    "empty_pieces_through_inductor": ("pieces that return nothing and write nothing go through Inductor, which saves "
                                      "no artifact for them: every warm start compiles them again",
                                          _empty_pieces_through_inductor),
    "loads_start_compile_workers": ("artifacts load under the user's compile_threads, so a warm start starts a "
                                    "pool of compile workers for kernels the artifact carries",
                                    _loads_start_compile_workers),
    "timing_not_interleaved": ("side-by-side timing runs each callable's rounds one after the other",
                               _timing_not_interleaved),
    "report_hides_what_the_split_costs": ("a FULL miss in the side-by-side runs never says what FULL without the "
                                          "split measured", _report_hides_what_the_split_costs),
    "report_hides_later_warm_starts": ("the report leaves out warm_start runs: a warm-start miss of an older asv "
                                       "run stays unexplained", _report_hides_later_warm_starts),
    "gate_ignores_controls": ("the gate judges every item, the controls that show drift between runs included",
                              _gate_ignores_controls),
    "report_ignores_side_by_side_profiles": ("the report explains a missed target only from the latency run's own "
                                             "profiles, never both sides", _report_ignores_side_by_side_profiles),
    "report_hides_where_the_first_call_went": (
        "the compile table and the warm-start miss never split the first call into the backend's time and Dynamo's",
        _report_hides_where_the_first_call_went),
    "report_hides_the_capture_cost": ("a missed capture target never says what the first size and each further "
                                      "graph cost", _report_hides_the_capture_cost),
    "report_latency_ratio_ignores_rounds": ("the latency tables and target rows divide one median by the other where "
                                            "the run timed both sides in rotating rounds",
                                            _report_latency_ratio_ignores_rounds),
    "code_size_counts_docstrings": ("the reference core's code lines include docstrings (the core's size target)",
                                    _code_size_counts_docstrings),
    "report_hides_the_kernel_difference": ("the report's miss notes never name the kernels only the slower side runs",
                                           _report_hides_the_kernel_difference),
    "gate_improvements_fail": ("an improvement beyond the threshold fails like a regression", _gate_improvements_fail),
    "preflight_ignores_other_processes": ("the preflight reads other processes on the GPU but lets them pass",
                                          _preflight_ignores_other_processes),
    "preflight_ignores_the_clock": ("the preflight lets a GPU held below its clock pass", _preflight_ignores_the_clock),
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
    "arg_check_skips_dtype": ("call-time argument checks ignore dtypes (property 10)", _arg_check_skips_dtype),
    "capture_smallest_first": ("the capture phase captures the smallest size first", _capture_smallest_first),
    "capture_keeps_outputs": ("graph runners keep owning references to each size's capture outputs",
                              _capture_keeps_outputs),
    "replay_leaks_outputs": ("every replay keeps a copy of its outputs", _replay_leaks_outputs),
    "checks_parameters_not_split_outputs": ("the replay address check reads parameters instead of caller inputs "
                                            "and splitting-op outputs", _checks_parameters_not_split_outputs),
    "unpad_top_level_only": ("padded outputs are cut back only at the top level, not in nested structures",
                             _unpad_top_level_only),
    "unpad_keeps_the_tail": ("padded outputs are cut back to their last rows instead of their first",
                             _unpad_keeps_the_tail),
    "outputs_alias_freed_memory": ("outputs view a freed copy instead of graph memory", _outputs_alias_freed_memory),
    "replay_copies_outputs": ("replays return copies of the graph's outputs", _replay_copies_outputs),
    "static_buffers_uninitialised": ("static input buffers come from torch.empty: padded rows hold garbage",
                                     _static_buffers_uninitialised),
    "no_copy_back_of_inplace_writes": ("in-place writes to arguments are not copied back from the static buffers",
                                       _no_copy_back_of_inplace_writes),
    "warmup_writes_twice": ("inputs written in place are not restored after the warm-ups", _warmup_writes_twice),
    "capture_snapshots_weights": ("captured graphs read copies of the parameters taken at capture",
                                  _capture_snapshots_weights),
    "unpad_cuts_every_n_rows": ("outputs are cut wherever dim 0 equals the padded size, not where the trace has the "
                                "batch (test_properties, test_replay_safety_gpu)", _unpad_cuts_every_n_rows),
    "unpad_skips_namedtuples": ("padded outputs inside a namedtuple are not cut back (test_properties)",
                                _unpad_skips_namedtuples),
    "first_call_runs_twice": ("the first call runs the model twice: the tracing run, then the call (test_properties)",
                              _first_call_runs_twice),
    "trace_writes_not_restored": ("what the batch-1 tracing run on copies wrote into model state stays "
                                  "(test_properties)", _trace_writes_not_restored),
    "value_check_ignores_type": ("argument checks compare plain values with == only: 2 passes for 2.0 "
                                 "(test_properties)", _value_check_ignores_type),
}


def apply(name: str, mp: pytest.MonkeyPatch) -> str:
    if name not in MUTANTS:
        raise pytest.UsageError(f"unknown mutant {name!r}; known: {sorted(MUTANTS)}")
    description, mutate = MUTANTS[name]
    mutate(mp)
    return description
