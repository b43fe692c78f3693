"""Mutants of the harness's tools: the implementation registry and adapters, the host-overhead breakdown, the
hypothesis strategies and the conformance suite's plugin and run."""

from __future__ import annotations

import atexit
import bisect
import dataclasses
import importlib
import secrets
import shutil
import tempfile
import types
from pathlib import Path

import pytest
import torch
from hypothesis import strategies as st

import pieceworks
import pieceworks.conformance.plan as plan
import pieceworks.conformance.plugin as conformance
import pieceworks.conformance.run as conformance_run
import pieceworks.conformance.subjects as subjects
import pieceworks.conformance.table as conformance_table
import pieceworks.harness.adapters as impls
import pieceworks.harness.adapters.base as adapter_base
import pieceworks.harness.measure.breakdown as breakdown
import pieceworks.harness.models.llama as llama
import pieceworks.harness.models.paged_attention as paged_attention
import pieceworks.harness.models.serving as serving
import pieceworks.harness.testing.strategies as strategies

from . import mutant

_IMPLS = "suites/test_implementations.py::"
_TP = "suites/test_tensor_parallel.py::"


@mutant(
    "a step's token ids follow its sequence slot, not its request: "
    "a request's tokens change with its batching",
    cpu="suites/test_serving.py::test_continuous_batching_gives_every_request_what_it_gets_alone",
)
def token_ids_by_slot(mp: pytest.MonkeyPatch) -> None:
    original = serving.step_inputs

    def step_inputs(model, step, device):
        ids, positions = original(model, step, device)
        slots = torch.tensor(step.tokens()[1], device=ids.device)
        return (ids + slots) % (model.config.vocab_size - 1), positions

    mp.setattr(serving, "step_inputs", step_inputs)


@mutant(
    "cache blocks handed to a sequence stay free for the next one: two sequences share blocks",
    cpu="suites/test_serving.py::test_cache_blocks_are_never_shared_and_come_back",
)
def cache_blocks_shared(mp: pytest.MonkeyPatch) -> None:
    def cover(self, step):
        for chunk in step.chunks:
            owned = self.owned.setdefault(chunk.slot, [])
            need = -(-(chunk.first + chunk.tokens) // self.block_size) - len(owned)
            owned += self.free[: max(need, 0)]  # not taken from the free list
            self.metadata.assign_blocks(chunk.slot, owned)

    mp.setattr(serving.KVBlocks, "cover", cover)


@mutant(
    "the attention ops run a call with more rows than the metadata holds: the kernels read past its buffers",
    cpu="suites/test_llama.py::test_a_batch_or_rows_beyond_max_tokens_is_a_clear_error_never_a_read_past_the_"
    "metadata",
)
def rows_past_the_metadata(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(paged_attention, "check_rows", lambda md, rows: None)


def _mutated_kernels(mp: pytest.MonkeyPatch, *changes: tuple[str, str, int]) -> None:
    """The ops launch attention_kernels.py with each change's `old` replaced by `new` (where the source holds
    it `count` times)."""
    source = (Path(paged_attention.__file__).parent / "attention_kernels.py").read_text()
    for old, new, count in changes:
        assert source.count(old) == count, f"the kernels' {old!r} moved: update this mutant"
        source = source.replace(old, new)
    folder = Path(tempfile.mkdtemp(prefix="pieceworks-mutant-"))  # Triton compiles from source files
    atexit.register(shutil.rmtree, folder, True)  # removed with this process
    (folder / "mutated_attention_kernels.py").write_text(source)
    mp.syspath_prepend(str(folder))
    mp.setattr(paged_attention, "KERNELS", "mutated_attention_kernels")


@mutant(
    "the attention kernels see one position past each sequence (an off-by-one in the length mask)",
    gpu="suites/test_attention_kernels_gpu.py::test_kernels_match_the_oracle_on_random_batches",
)
def attention_sees_one_position_more(mp: pytest.MonkeyPatch) -> None:
    _mutated_kernels(
        mp,
        ("length = tl.load(lens + t)", "length = tl.load(lens + t) + 1", 1),
        ("length, row = tl.load(seq_lens + s),", "length, row = tl.load(seq_lens + s) + 1,", 1),
    )


@mutant(
    "the attention metadata's host plan is keyed by its values: "
    "a warm start whose first batch differs traces",
    cpu="suites/test_llama.py::test_the_model_is_keyed_for_a_serving_record_whatever_its_current_batch",
)
def plan_keyed_by_its_values(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(paged_attention.HostPlan, "uuid", None)


@mutant(
    "a sharded Llama layer never all-reduces its partial sums",
    cpu=_TP + "test_all_reduces_as_splitting_ops_give_the_whole_models_output_on_every_rank",
)
def tensor_parallel_without_all_reduce(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(llama.Block, "reduced", lambda self, t: t)


@mutant(
    "resolve('module:Subclass') returns the class, not an instance",
    cpu=_IMPLS + "test_resolve_by_dotted_path",
)
def resolve_returns_the_class(mp: pytest.MonkeyPatch) -> None:
    original = impls.resolve

    def resolve(spec):
        if spec not in impls.IMPLEMENTATIONS and ":" in spec:
            module, _, attr = spec.partition(":")
            return getattr(importlib.import_module(module), attr)  # a subclass comes back uninstantiated
        return original(spec)

    mp.setattr(impls, "resolve", resolve)


@mutant(
    "load_user_implementations resolves but registers nothing",
    cpu=_IMPLS + "test_user_implementations_from_the_environment",
)
def user_implementations_not_registered(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(impls, "register", lambda impl: impl)


@mutant(
    "Meta pcg's adapter claims to be available without the package", cpu=_IMPLS + "test_unavailable_reasons"
)
def pcg_always_available(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(impls.MetaPCG, "unavailable_reason", impls.Implementation.unavailable_reason)


@mutant(
    "Meta pcg's adapter replays the captured size below the batch",
    gpu=_IMPLS + "test_compiler_free_peers_pad_and_serve_like_eager",
)
def pcg_pads_to_the_size_below(mp: pytest.MonkeyPatch) -> None:
    def below(sizes, batch):
        i = bisect.bisect_left(sizes, batch)
        return None if i == len(sizes) else sizes[max(i - 1, 0)]

    mp.setattr(adapter_base, "padded_size", below)  # what the padded server of Meta pcg's adapter reads


@mutant(
    "an adapter's compile count includes earlier builds' compiles",
    cpu=_IMPLS + "test_the_adapters_compile_count_is_what_the_build_compiled",
)
def adapter_counts_the_session(mp: pytest.MonkeyPatch) -> None:
    original = impls.Pieceworks.build

    def build(self, *args, **kwargs):
        before = pieceworks.counters.num_inductor_compiles + pieceworks.counters.num_eager_compiles
        built = original(self, *args, **kwargs)
        return dataclasses.replace(built, compiles=built.compiles + before)

    mp.setattr(impls.Pieceworks, "build", build)


@mutant(
    "the host-overhead breakdown leaves the splitting pieces out",
    cpu="suites/test_host_overhead.py::test_host_overhead_cpu",
)
def breakdown_drops_splitting_ops(mp: pytest.MonkeyPatch) -> None:
    original = breakdown.record

    def record(compiled, args, uniform=False):
        out, work = original(compiled, args, uniform)
        return out, [w for w in work if not w.splitting]

    mp.setattr(breakdown, "record", record)


@mutant("capture-size draws never include size 1", cpu="suites/test_strategies.py::test_sizes_reach")
def capture_sizes_skip_one(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(
        strategies,
        "capture_sizes",
        lambda max_size=64, max_count=12: st.lists(
            st.integers(2, max_size), min_size=1, max_size=max_count, unique=True
        ).map(sorted),
    )


@mutant(
    "batch sequences never go above the largest capture size",
    cpu="suites/test_strategies.py::test_sizes_reach",
)
def batches_never_beyond(mp: pytest.MonkeyPatch) -> None:
    original = strategies.batch_sequences
    mp.setattr(
        strategies,
        "batch_sequences",
        lambda max_size=64, beyond=16, max_len=12: original(max_size, 0, max_len),
    )


@mutant(
    "a conformance run in which every test was skipped exits 0",
    cpu="suites/test_conformance_suite.py::test_a_run_in_which_nothing_ran_fails_saying_why",
)
def conformance_nothing_ran_passes(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(conformance, "nothing_ran", lambda results: None)


@mutant(
    "a conformance run draws its capture sizes from a seed of its own, not the one it prints and records "
    "(as when run.py was imported twice, each copy drawing a seed)",
    cpu="suites/test_conformance_suite.py::test_a_run_drawing_its_seed_prints_the_seed_and_sizes_it_served",
)
def conformance_sizes_from_another_seed(mp: pytest.MonkeyPatch) -> None:
    def draw(plan_seed, max_size=plan.DEFAULT_MAX_SIZE, max_count=plan.DEFAULT_MAX_COUNT):
        recorded = plan.Plan.draw(plan_seed, max_size, max_count).capture_sizes
        for _ in range(100):  # a fresh seed drawing other sizes than the recorded seed's, where there are any
            sizes = plan.Plan.draw(secrets.randbelow(2**32), max_size, max_count).capture_sizes
            if sizes != recorded:
                break
        return plan.Plan(plan_seed, sizes)

    mp.setattr(conformance_run, "Plan", types.SimpleNamespace(draw=draw))  # the name resolve draws through


_HF = "suites/test_hf_models.py::"


@mutant(
    "a Hugging Face model served on tokens keeps transformers' own attention, not the paged splitting op",
    cpu=_HF
    + "test_each_shipped_config_builds_with_a_paged_kv_cache_per_layer_called_through_the_splitting_op",
)
def hf_attention_not_routed(mp: pytest.MonkeyPatch) -> None:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    import pieceworks.harness.models.hf_attention as hf

    # what hf_llama registers under its name
    mp.setattr(hf, "paged_attention_forward", sdpa_attention_forward)


@mutant(
    "the serving benchmark's config model gets the tiny cache blocks (4 positions) "
    "instead of the presets' 16",
    cpu=_HF + "test_the_serving_benchmark_takes_a_config_json_and_runs_on_a_cpu_up_to_where_cuda_is_needed",
)
def config_model_with_tiny_blocks(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.harness.models.hf_llama as hf

    original = hf.paged_model
    mp.setattr(
        hf,
        "paged_model",
        lambda *args, serving=None, **kwargs: original(
            *args, serving={k: v for k, v in (serving or {}).items() if k != "block_size"}, **kwargs
        ),
    )


_ARCH = "suites/test_hf_architectures.py::"
_EQUAL = (
    _ARCH + "test_each_architecture_equals_transformers_own_attention_on_left_padded_rows_beyond_the_window"
)


def _split_route_calls(mp: pytest.MonkeyPatch, change) -> None:
    """The split route's attention functions, each call's arguments changed first by `change(args, kwargs)`,
    which returns the new ones."""
    import pieceworks.harness.models.hf_attention as hf

    original = hf.split_attention

    def split_attention(base):
        forward = original(base)

        def changed(*args, **kwargs):
            args, kwargs = change(list(args), dict(kwargs))
            return forward(*args, **kwargs)

        return changed

    mp.setattr(hf, "split_attention", split_attention)


@mutant(
    "the split route drops the mask transformers built (padding and window): causal attention over every row",
    cpu=f"{_EQUAL}[llama]",
)
def split_route_without_mask(mp: pytest.MonkeyPatch) -> None:
    _split_route_calls(mp, lambda args, kwargs: (args[:4] + [None] + args[5:], kwargs))


@mutant(
    "the split route's mask leaves out the sliding window (padding kept)",
    cpu=f"{_EQUAL}[mistral]",
)
def split_route_without_window(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.harness.models.hf_attention as hf

    original = hf.register_attention

    def register_attention():
        transformers = original()
        masks = transformers.masking_utils

        def causal_mask(*args, **kwargs):
            kwargs |= {"mask_function": masks.causal_mask_function, "local_size": None}
            return masks.sdpa_mask(*args, **kwargs)

        transformers.AttentionMaskInterface.register("split", causal_mask)
        return transformers

    mp.setattr(hf, "register_attention", register_attention)


@mutant("the split route drops Gemma 2's logit soft-capping", cpu=f"{_EQUAL}[gemma2]")
def split_route_without_softcap(mp: pytest.MonkeyPatch) -> None:
    _split_route_calls(mp, lambda args, kwargs: (args, {k: v for k, v in kwargs.items() if k != "softcap"}))


@mutant(
    "the split route returns no attention weights where transformers' eager attention returns them, silently",
    cpu=_ARCH + "test_attention_weights_are_refused_where_transformers_own_attention_returns_them",
)
def split_route_drops_attention_weights(mp: pytest.MonkeyPatch) -> None:
    _split_route_calls(
        mp, lambda args, kwargs: (args, {k: v for k, v in kwargs.items() if k != "output_attentions"})
    )


@mutant(
    "the split route refuses a call that asks for hidden states",
    cpu=_ARCH + "test_hidden_states_are_served_once_transformers_installed_its_output_hooks[llama]",
)
def split_route_refuses_hidden_states(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.harness.models.hf_attention as hf

    mp.setattr(hf, "COMPUTED", hf.COMPUTED - {"output_hidden_states"})


_PAGED = _ARCH + "test_each_architecture_served_paged_equals_transformers_own_attention_past_the_window"
_PAGED_GPU = _ARCH + "test_windowed_architectures_served_paged_from_cuda_graphs_equal_their_own_attention"


def _paged_route_calls(mp: pytest.MonkeyPatch, change) -> None:
    """The paged route's attention function, each call's keywords changed first by `change(kwargs)`."""
    import pieceworks.harness.models.hf_attention as hf

    original = hf.paged_attention_forward
    mp.setattr(hf, "paged_attention_forward", lambda *args, **kwargs: original(*args, **change(kwargs)))


@mutant("the paged route leaves out the layer's sliding window", cpu=f"{_PAGED}[mistral]")
def paged_route_without_window(mp: pytest.MonkeyPatch) -> None:
    _paged_route_calls(mp, lambda kwargs: {k: v for k, v in kwargs.items() if k != "sliding_window"})


@mutant("the paged route leaves out the layer's logit soft-capping", cpu=f"{_PAGED}[gemma2]")
def paged_route_without_softcap(mp: pytest.MonkeyPatch) -> None:
    _paged_route_calls(mp, lambda kwargs: {k: v for k, v in kwargs.items() if k != "softcap"})


@mutant(
    "the paged route serves an encoder causally (it attends both ways)",
    cpu=_ARCH + "test_an_encoder_served_paged_is_refused_by_name_the_paged_ops_being_causal",
)
def paged_route_serves_both_ways_causally(mp: pytest.MonkeyPatch) -> None:
    _paged_route_calls(mp, lambda kwargs: {**kwargs, "is_causal": True})


@mutant("the attention kernels ignore the sliding window", gpu=f"{_PAGED_GPU}[mistral-unified-FULL]")
def kernels_without_window(mp: pytest.MonkeyPatch) -> None:
    _mutated_kernels(mp, ("if WINDOW > 0", "if WINDOW < 0", 3))


@mutant(
    "the attention kernels ignore logit soft-capping", gpu=f"{_PAGED_GPU}[gemma2-varlen-FULL_AND_PIECEWISE]"
)
def kernels_without_softcap(mp: pytest.MonkeyPatch) -> None:
    _mutated_kernels(mp, ("if SOFTCAP > 0", "if SOFTCAP < 0", 1))


@mutant(
    "the split route serves an attention argument it does not compute (GPT-OSS's sinks dropped silently)",
    cpu=_ARCH + "test_what_the_route_does_not_compute_is_refused_at_the_first_call_by_name",
)
def split_route_takes_any_argument(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.harness.models.hf_attention as hf

    everything = type("Everything", (), {"__contains__": lambda self, key: True})()
    mp.setattr(hf, "COMPUTED", everything)


@mutant(
    "the conformance sweep stops just above the largest capture size: a runtime wrong above batch 100 passes",
    cpu="suites/test_conformance_suite.py::test_each_planted_bug_fails_its_property",
)
def conformance_sweep_stops_near_the_largest(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(plan.Plan, "far", property(lambda self: []))


@mutant(
    "the conformance suite's default models are all float32",
    cpu="suites/test_conformance_plan.py::test_the_default_models_hold_a_bfloat16_one",
)
def conformance_models_all_float32(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(subjects, "DEFAULT_MODELS", ("silly", "silly-inplace", "toy-llama", "hf-llama", "llama"))


@mutant(
    "the conformance table joins a run's parts by keeping the seed of the first and its cells: a part of "
    "another run, or the other parts' rows, pass unseen",
    cpu="suites/test_conformance_suite.py::test_the_parts_of_a_run_split_by_impl_make_one_table",
)
def conformance_parts_joined_blindly(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(conformance_table, "merge", lambda documents: documents[0])
