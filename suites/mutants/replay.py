"""Mutants of capture and replay (CUDA graphs: their tests run on a GPU): capture order and memory, the
address checks, the outputs a replay returns, static input buffers and in-place writes."""

from __future__ import annotations

import pytest
import torch

import pieceworks
import pieceworks.batch_kind as batch_kind
import pieceworks.cudagraph as cudagraph
import pieceworks.model.compiled_model as api
import pieceworks.padding as padding
import pieceworks.plan as plan
import pieceworks.runtime as runtime
from pieceworks.values import tensors_in, tree_map

from . import mutant

_POOL = "suites/test_pool_gpu.py::"
_SAFETY = "suites/test_replay_safety_gpu.py::"
_WRITES = "suites/test_writes_gpu.py::"
_TP = "suites/test_tensor_parallel.py::"


@mutant(
    "ranks capture without checking that all capture the same sizes: a mismatch waits forever",
    cpu=_TP + "test_ranks_that_would_capture_different_sizes_all_raise_naming_the_rank_that_differs",
    gpu="suites/test_tensor_parallel_gpu.py::test_ranks_with_other_capture_sizes_fail_fast_naming_the_rank",
)
def ranks_never_compared(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(runtime, "check_ranks_agree", lambda mode, sizes, device=None: None)


@mutant(
    "a capture whose capture_end raised leaves the allocator routing to its pool: the process aborts at its "
    "next free",
    gpu="suites/test_capture_failures_gpu.py::test_a_failed_full_capture_leaves_the_process_healthy",
)
def failed_capture_keeps_routing(mp: pytest.MonkeyPatch) -> None:
    # what a failed capture_end skipped
    mp.setattr(torch._C, "_cuda_endAllocateToPool", lambda device, pool: None)


_FAILURES = "suites/test_capture_failures_gpu.py::"


@mutant(
    "after a failed capture, later captures begin in its pool, which the allocator forgot",
    gpu=_FAILURES + "test_after_a_failed_capture_in_any_mode_inductor_compiles_and_captures_another_model"
    "[FULL_AND_PIECEWISE-raises] "
    + _FAILURES
    + "test_after_a_failed_piecewise_capture_the_next_capture_begins_in_a_fresh_pool",
)
def failed_capture_pool_reused(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(cudagraph.CapturePool, "reset", lambda self: torch.cuda.synchronize())


@mutant(
    "modes are never lowered to what the splitting ops support: a FULL graph holds a host-planned attention",
    cpu="suites/test_modes_cpu.py::test_modes_are_lowered_to_what_the_splitting_ops_support",
    gpu="suites/test_llama.py::test_cuda_graphs_serve_decode_and_mixed_batches_like_eager",
)
def modes_never_lowered(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(batch_kind, "supported_mode", lambda mode, support: mode)


@mutant(
    "uniform_decode() marks nothing: every call is served as a mixed batch",
    cpu="suites/test_modes_cpu.py::test_graph_support_is_the_least_declared_and_uniform_decode_is_scoped",
    gpu="suites/test_cudagraph_gpu.py::test_each_kind_of_batch_replays_what_its_mode_gives_it",
)
def uniform_decode_ignored(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(pieceworks.uniform_decode, "__enter__", lambda self: None)


@mutant(
    "identical pieces each warm up at every size, though the first one's warm-up served them all",
    gpu=_POOL + "test_each_runnable_warms_up_once_per_size_full_graphs_at_every_size",
)
def identical_pieces_all_warm_up(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(
        cudagraph.CapturePool,
        "capture_piece",
        lambda self, fn, args, mutated, padded_size: self.capture(fn, args, mutated, self.num_warmups),
    )


@mutant(
    "the pool estimate leaves its sample's memory with the allocator instead of the device",
    gpu=_POOL + "test_the_pool_estimate_comes_before_capture_frees_its_sample_and_is_close",
)
def estimate_keeps_its_sample(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(torch.cuda, "empty_cache", lambda: None)


@mutant(
    "the pool estimate reports the largest size's pool alone, leaving out what the smaller sizes add",
    gpu=_POOL + "test_the_pool_estimate_counts_what_smaller_sizes_add",
)
def estimate_of_the_largest_alone(mp: pytest.MonkeyPatch) -> None:
    original = api.CompiledModel.estimate_capture

    def estimate(self, sizes=None, samples=6):
        report = original(self, sizes, samples)
        return {**report, "pool_bytes": report["largest_bytes"]}

    mp.setattr(api.CompiledModel, "estimate_capture", estimate)


@mutant(
    "the capture phase captures the smallest size first", gpu=_POOL + "test_capture_order_is_largest_first"
)
def capture_smallest_first(mp: pytest.MonkeyPatch) -> None:
    order = runtime.Runtime.capture_order
    mp.setattr(runtime.Runtime, "capture_order", lambda self, sizes: order(self, sizes)[::-1])


@mutant(
    "graph runners keep owning references to each size's capture outputs",
    gpu=_POOL + "test_one_pool_for_all_sizes_costs_no_more_than_the_largest_alone",
)
def capture_keeps_outputs(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(plan, "non_owning_alias", lambda value: value)  # FULL graphs and plans own each size's outputs


@mutant(
    "captured graphs read copies of the parameters taken at capture",
    gpu="suites/test_replay_state_gpu.py::test_weights_loaded_in_place_reach_every_captured_size",
)
def capture_snapshots_weights(mp: pytest.MonkeyPatch) -> None:
    original = cudagraph.CapturePool.capture

    def capture(self, fn, args, mutated, warmups=None):
        snapshot = [a.clone() if isinstance(a, torch.nn.Parameter) else a for a in args]
        self.__dict__.setdefault("_snapshots", []).append(snapshot)  # graphs read these copies from now on
        return original(self, fn, snapshot, mutated, warmups)

    mp.setattr(cudagraph.CapturePool, "capture", capture)


@mutant(
    "inputs written in place are not restored after the warm-ups",
    gpu=_WRITES + "test_inplace_writes_happen_once_per_call",
)
def warmup_writes_twice(mp: pytest.MonkeyPatch) -> None:
    original = cudagraph.CapturePool.capture
    # nothing saved before the warm-ups, nothing put back before the capture
    mp.setattr(
        cudagraph.CapturePool,
        "capture",
        lambda self, fn, args, mutated, warmups=None: original(self, fn, args, [], warmups),
    )


@mutant(
    "PIECEWISE on a graph with no splitting op captures nothing",
    gpu="suites/test_user_faults.py::test_piecewise_without_a_splitting_op_captures_the_one_piece_per_size",
)
def unsplit_piecewise_runs_without_graphs(mp: pytest.MonkeyPatch) -> None:
    original = runtime.effective_mode

    def effective(config, graph):
        chosen = original(config, graph)
        split = any(p.is_splitting_graph for p in graph.pieces)
        return (
            runtime.CUDAGraphMode.NONE if chosen is runtime.CUDAGraphMode.PIECEWISE and not split else chosen
        )

    mp.setattr(runtime, "effective_mode", effective)


@mutant(
    "the replay address check reads parameters instead of caller inputs and splitting-op outputs",
    gpu=f"{_SAFETY}test_fresh_split_outputs_raise_or_are_right_never_stale "
    f"{_SAFETY}test_caller_inputs_that_move_raise_or_are_right_never_stale",
)
def checks_parameters_not_split_outputs(mp: pytest.MonkeyPatch) -> None:
    original = plan.ReplayPlan.__init__

    def init(self, padded_size, steps, num_slots, output, cheap_checks, all_checks, *rest):
        # check what only debug mode checks (parameters), not what can move
        original(
            self,
            padded_size,
            steps,
            num_slots,
            output,
            [c for c in all_checks if c not in cheap_checks],
            all_checks,
            *rest,
        )

    mp.setattr(plan.ReplayPlan, "__init__", init)
    replay = plan.replay_step
    # fresh split outputs: unchecked
    mp.setattr(plan, "replay_step", lambda cuda_graph, moved: replay(cuda_graph, []))


def _wrap_replays(mp: pytest.MonkeyPatch, wrap) -> None:
    """`wrap(outputs, owner)` applied to what every replay (FULL graph or PIECEWISE plan) returns."""
    original = plan.ReplayPlan.run
    mp.setattr(plan.ReplayPlan, "run", lambda self, args, checks=(): wrap(original(self, args, checks), self))


@mutant("every replay keeps a copy of its outputs", gpu=_POOL + "test_thousands_of_replays_grow_no_memory")
def replay_leaks_outputs(mp: pytest.MonkeyPatch) -> None:
    def leak(out, owner):
        owner.__dict__.setdefault("_history", []).append([t.clone() for t in tensors_in(out)])
        return out

    _wrap_replays(mp, leak)


@mutant(
    "replays return copies of the graph's outputs",
    gpu=_WRITES + "test_outputs_are_valid_until_the_next_call_and_overwritten_by_it",
)
def replay_copies_outputs(mp: pytest.MonkeyPatch) -> None:
    _wrap_replays(mp, lambda out, owner: tree_map(lambda v: v.clone() if hasattr(v, "clone") else v, out))


def _unpad_with(mp: pytest.MonkeyPatch, cut, nested: bool = True) -> None:
    """Outputs cut back by the shape rule (dim 0 equal to the padded size, ignoring the trace's marks) with
    `cut(tensor, batch, n)`; in nested tuples and lists, or only at the top level."""

    def unpad(value, batch, n, batched=None, depth=0):
        if isinstance(value, torch.Tensor):
            return cut(value, batch, n) if value.dim() > 0 and value.shape[0] == n else value
        if isinstance(value, (tuple, list)) and (nested or depth == 0):
            return type(value)(unpad(v, batch, n, depth=depth + 1) for v in value)
        return value

    mp.setattr(api, "unpad", unpad)


@mutant(
    "padded outputs are cut back only at the top level, not in nested structures",
    gpu=_SAFETY + "test_padded_outputs_are_cut_back_in_nested_tuples_and_lists",
)
def unpad_top_level_only(mp: pytest.MonkeyPatch) -> None:
    _unpad_with(mp, lambda t, batch, n: t[:batch], nested=False)


@mutant(
    "padded outputs are cut back to their last rows instead of their first",
    gpu=_SAFETY + "test_poisoned_rows_never_reach_the_rows_of_later_calls",
)
def unpad_keeps_the_tail(mp: pytest.MonkeyPatch) -> None:
    _unpad_with(mp, lambda t, batch, n: t[n - batch :])


@mutant(
    "outputs view a freed copy instead of graph memory",
    gpu=_WRITES + "test_outputs_are_valid_until_the_next_call_and_overwritten_by_it",
)
def outputs_alias_freed_memory(mp: pytest.MonkeyPatch) -> None:
    _unpad_with(mp, lambda t, batch, n: cudagraph.non_owning_alias(t[:batch].clone()))


@mutant(
    "static input buffers come from torch.empty: padded rows hold garbage",
    gpu=_SAFETY + "test_padded_rows_never_hold_uninitialised_values",
)
def static_buffers_uninitialised(mp: pytest.MonkeyPatch) -> None:
    original = padding.StaticInputs.__init__

    def init(self, example_args, max_size):
        original(self, example_args, max_size)
        for buffer, a in zip(self.buffers, example_args):
            if isinstance(a, torch.Tensor):
                buffer.view(torch.uint8).fill_(0x7F)  # what a reused block may hold: huge ids and floats
                buffer[: a.shape[0]].copy_(a)

    mp.setattr(padding.StaticInputs, "__init__", init)


@mutant(
    "in-place writes to arguments are not copied back from the static buffers",
    gpu=_WRITES + "test_inplace_writes_happen_once_per_call",
)
def no_copy_back_of_inplace_writes(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(padding.StaticInputs, "copy_back", lambda self, args, batch, positions: None)
