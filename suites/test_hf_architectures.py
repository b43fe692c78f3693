"""Hugging Face decoders of every architecture in `hf_llama.ARCHITECTURES`, served through the split
route (`attn_implementation="split"`, harness/models/hf_attention.py), equal to the same model run with
transformers' own attention (the one transformers picks for it: SDPA, or eager for Gemma 2), never to a
restatement of it.

Each is called as batched generation calls it: keywords, an `attention_mask` with left-padded rows, several
batch sizes, sequences (SEQ = 8 tokens) longer than the 4-token sliding window of the families that have one;
and each warm-starts in a new process from the serving record of the first, with no trace.
Equal on the real tokens (a padded position's output is whatever the model makes of a row it masks out). What
the route does not compute is refused by name (`hf_llama.REFUSED`), and docs/your-model.md's table says the
same as the harness. The paged route (`hf_llama.paged_model`, as engines serve a model) equals transformers'
own attention too, step after step, past the window. On a GPU, two windowed families are served from CUDA
graphs through both routes with the same result. Needs transformers (the `test` extra installs it); without
it every test here is skipped, saying so.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch

import pieceworks
from pieceworks import CompilationConfig, counters
from pieceworks.harness.models import hf_attention, llama
from pieceworks.harness.models import hf_llama as hf

pytestmark = pytest.mark.skipif(hf.unavailable_reason() is not None, reason=str(hf.unavailable_reason()))

SERVED = [name for name in hf.ARCHITECTURES if name not in hf.REFUSED]


def twins(name: str, device: str = "cpu", **overrides) -> tuple[torch.nn.Module, torch.nn.Module]:
    """The tiny model of architecture `name` (config fields overridden by `overrides`) through the split
    route, and the same weights with the attention transformers picks for it."""
    model = hf.causal_lm(hf.tiny_config(name, **overrides), device)
    transformers = hf_attention.register_attention()
    own = transformers.AutoModelForCausalLM.from_config(hf.tiny_config(name, **overrides)).to(device).eval()
    own.load_state_dict(model.state_dict())
    assert (
        model.config._attn_implementation
        == {"sdpa": "split", "eager": "split_eager"}[own.config._attn_implementation]
    )
    return model, own


def first_calls(cache_dir: str) -> dict[str, dict[str, int]]:
    """In a process of its own: each served architecture (one layer) compiled with Inductor and the cache in
    `cache_dir`, its first calls checked as `check_equal` checks them; per architecture, what they traced,
    reused and compiled."""
    found = {}
    for name in SERVED:
        model, own = twins(name, num_hidden_layers=1)
        config = CompilationConfig(splitting_ops=hf.SPLITTING_OPS, cudagraph_mode="NONE", cache_dir=cache_dir)
        compiled, before = pieceworks.compile(model, config), counters.snapshot()
        with torch.no_grad():
            check_equal(compiled, own, [3, 1])
        found[name] = {k: v - before[k] for k, v in counters.snapshot().items() if k in COUNTED}
    return found


COUNTED = ("num_dynamo_traces", "num_traces_reused", "num_inductor_compiles")


@pytest.fixture(scope="module", autouse=True)
def warm_starts(early_processes, tmp_path_factory):
    """`first_calls` in a process, then in another one sharing its cache, started before the module's first
    test: they run beside the module's tests on the other core."""
    early_processes.start(
        test_each_architecture_warm_starts_in_a_new_process_without_a_trace,
        [
            sys.executable,
            "-c",
            "import json, sys; from pieceworks.harness.testing.scenario import run_case; "
            "print(json.dumps([run_case(sys.argv[1], {'cache_dir': sys.argv[2]}, 400) for _ in 'ab']))",
            f"{__file__}:first_calls",
            str(tmp_path_factory.mktemp("warm-starts")),
        ],
        timeout=800,
    )


def left_padded(batch: int, seed: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Token ids [batch, SEQ] and their attention mask, row k padded on the left by k % 4 tokens."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, hf.VOCAB, (batch, hf.SEQ), generator=gen)
    mask = (torch.arange(hf.SEQ)[None, :] >= (torch.arange(batch) % 4)[:, None]).long()
    return {"input_ids": (ids * mask).to(device), "attention_mask": mask.to(device)}


def check_equal(compiled, own, batches, device: str = "cpu") -> None:
    for batch in batches:
        inputs = left_padded(batch, seed=batch, device=device)
        got = compiled(**inputs, use_cache=False).logits
        expected = own(**inputs, use_cache=False).logits
        real = inputs["attention_mask"].bool()
        torch.testing.assert_close(
            got[real], expected[real], msg=lambda m, batch=batch: f"batch {batch}: {m}"
        )


@pytest.mark.parametrize("name", SERVED)
def test_each_architecture_equals_transformers_own_attention_on_left_padded_rows_beyond_the_window(name):
    model, own = twins(name)
    config = CompilationConfig(splitting_ops=hf.SPLITTING_OPS, cudagraph_mode="NONE", compiler="eager")
    compiled = pieceworks.compile(model, config)
    with torch.no_grad():
        check_equal(compiled, own, [3, 1, 5])


@pytest.mark.inductor
def test_phi3s_fused_projection_compiles_with_inductor_and_equals_its_own_attention():
    """Phi-3's query, key and value are slices of one fused projection: the op's output is contiguous in the
    fake run and the real one alike, so Inductor's stride checks hold."""
    model, own = twins("phi3")
    compiled = pieceworks.compile(
        model, CompilationConfig(splitting_ops=hf.SPLITTING_OPS, cudagraph_mode="NONE")
    )
    with torch.no_grad():
        check_equal(compiled, own, [2, 1])


@pytest.mark.parametrize("name", sorted(hf.REFUSED))
def test_what_the_route_does_not_compute_is_refused_at_the_first_call_by_name(name):
    model, _ = twins(name)
    compiled = pieceworks.compile(model, CompilationConfig(splitting_ops=hf.SPLITTING_OPS, compiler="eager"))
    with pytest.raises(Exception, match=rf"UnsupportedAttentionError.*{hf.REFUSED[name]}.*Fix: "):
        compiled(**left_padded(2, seed=0), use_cache=False)


def test_soft_capping_under_the_sdpa_route_is_refused_naming_the_eager_route():
    hf_attention.register_attention()
    model = hf.causal_lm(hf.tiny_config("gemma2"))
    model.config._attn_implementation = "split"  # as transformers' "sdpa", which refuses Gemma 2 too
    compiled = pieceworks.compile(model, CompilationConfig(splitting_ops=hf.SPLITTING_OPS, compiler="eager"))
    with pytest.raises(Exception, match=r"soft-capping.*split_eager"):
        compiled(**left_padded(2, seed=0), use_cache=False)


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_hidden_states_are_served_once_transformers_installed_its_output_hooks(name):
    """transformers installs its output hooks the first time a call asks for outputs (under a lock Dynamo
    cannot trace): an eager call does it, then compiled calls return every layer's hidden states as
    transformers' own attention gives them."""
    model, own = twins(name)
    with torch.no_grad():
        model(**left_padded(1, seed=0), output_hidden_states=True, use_cache=False)
        compiled = pieceworks.compile(
            model, CompilationConfig(splitting_ops=hf.SPLITTING_OPS, compiler="eager", cudagraph_mode="NONE")
        )
        for batch in [3, 1, 5]:
            inputs = left_padded(batch, seed=batch)
            got = compiled(**inputs, output_hidden_states=True, use_cache=False).hidden_states
            expected = own(**inputs, output_hidden_states=True, use_cache=False).hidden_states
            real = inputs["attention_mask"].bool()
            assert len(got) == len(expected) == model.config.num_hidden_layers + 1
            for layer, (a, b) in enumerate(zip(got, expected)):
                torch.testing.assert_close(a[real], b[real], msg=lambda m, layer=layer: f"layer {layer}: {m}")


def test_attention_weights_are_refused_where_transformers_own_attention_returns_them():
    """Gemma 2 runs eagerly in transformers, which returns attention weights; the split route computes
    none. (Under sdpa transformers returns none either, and so does the route.)"""
    model, _ = twins("gemma2")
    with torch.no_grad():
        model(**left_padded(1, seed=0), output_hidden_states=True, use_cache=False)  # installs every hook
    compiled = pieceworks.compile(model, CompilationConfig(splitting_ops=hf.SPLITTING_OPS, compiler="eager"))
    with pytest.raises(Exception, match=r"attention weights \(output_attentions=True\).*Fix: "):
        compiled(**left_padded(2, seed=0), output_attentions=True, use_cache=False)


def test_another_sequence_length_is_an_input_error_that_says_to_pad():
    model, _ = twins("llama")
    config = CompilationConfig(splitting_ops=hf.SPLITTING_OPS, compiler="eager", cudagraph_mode="NONE")
    compiled = pieceworks.compile(model, config)
    with torch.no_grad():
        compiled(**left_padded(2, seed=0), use_cache=False)
        longer = {k: torch.cat([v, v[:, :4]], 1) for k, v in left_padded(2, seed=1).items()}
        with pytest.raises(
            pieceworks.InputError, match=r"trailing shape \(8,\)\. Fix: pad every size but dim 0"
        ):
            compiled(**longer, use_cache=False)
        with pytest.raises(
            pieceworks.InputError, match=r"dtype=torch.int64.*Fix: pass arguments like the first"
        ):
            compiled(**{k: v.int() for k, v in left_padded(2, seed=1).items()}, use_cache=False)


def test_the_docs_table_lists_every_architecture_its_attention_and_verdict_as_the_harness_says():
    text = (Path(__file__).resolve().parent.parent / "docs" / "your-model.md").read_text()
    found = re.findall(r"^\| `(\w+)` \| (\w+) \| (served|refused[^|]*) \|", text, re.M)
    assert [name for name, *_ in found] == list(hf.ARCHITECTURES), found
    transformers = hf_attention.register_attention()
    for name, attention, verdict in found:
        with torch.device("meta"):
            own = transformers.AutoModelForCausalLM.from_config(hf.tiny_config(name))
        assert attention == own.config._attn_implementation, (name, attention)
        assert verdict.startswith("refused") == (name in hf.REFUSED), (name, verdict)
        assert name not in hf.REFUSED or hf.REFUSED[name] in verdict, (name, verdict)


# The paged route, as engines serve a model: the tokens of several sequences in one batch, keys and values
# kept in the paged cache between steps. Steps of (sequence, first position, tokens): two prefill chunks; a
# decode beside a chunk that runs past the 4-token window; two decodes; a 12-token prefill.
STEPS = [((0, 0, 6), (1, 0, 3)), ((0, 6, 1), (1, 3, 7)), ((0, 7, 1), (1, 10, 1)), ((2, 0, 12),)]


def paged_twins(name: str, device: str = "cpu", attention: str = "varlen"):
    """The tiny decoder of architecture `name` served paged (`hf_llama.paged_model`), and the same weights
    run by transformers with its own attention."""
    model = hf.paged_model(hf.tiny_config(name), device, serving={"attention": attention})
    own = hf_attention.register_attention().AutoModel.from_config(hf.tiny_config(name)).to(device).eval()
    own.load_state_dict(model.decoder.state_dict())
    return model, own


def check_paged(model, own, serve, device: str = "cpu", tolerance: float | None = None) -> None:
    """Serves `STEPS` through `serve(ids, positions, uniform_decode)`: every token's hidden state equals the
    one transformers computes for it over its whole sequence so far."""
    tokens: dict[int, list[int]] = {}
    for number, step in enumerate(STEPS):
        seq_ids = torch.tensor([seq for seq, _, n in step for _ in range(n)])
        positions = torch.cat([torch.arange(first, first + n) for _, first, n in step])
        ids, pos = llama.serve_tokens(model, seq_ids, positions, device, seed=number)
        for seq, position, token in zip(seq_ids.tolist(), positions.tolist(), ids.tolist()):
            assert len(tokens.setdefault(seq, [])) == position
            tokens[seq].append(token)
        got = serve(ids, pos, all(n == 1 for *_, n in step))
        for seq, first, n in step:
            sequence = torch.tensor([tokens[seq]], device=device)
            expected = own(input_ids=sequence, use_cache=False).last_hidden_state[0, first : first + n]
            torch.testing.assert_close(
                got[(seq_ids == seq).nonzero()[:, 0].to(device)],
                expected,
                rtol=tolerance,
                atol=tolerance,
                msg=lambda m, number=number, seq=seq: f"step {number}, sequence {seq}: {m}",
            )


@pytest.mark.parametrize("name", SERVED)
def test_each_architecture_served_paged_equals_transformers_own_attention_past_the_window(name):
    """The paged ops apply each layer's sliding window and soft-capping (the oracle, on the CPU)."""
    model, own = paged_twins(name)
    config = CompilationConfig(
        splitting_ops=model.config.splitting_ops, compiler="eager", cudagraph_mode="NONE"
    )
    compiled = pieceworks.compile(model, config)
    with torch.no_grad():
        check_paged(model, own, lambda ids, positions, uniform: compiled(ids, positions))


@pytest.mark.parametrize("name", sorted(hf.REFUSED))
def test_what_the_paged_route_does_not_compute_is_refused_by_name(name):
    model, _ = paged_twins(name)
    with pytest.raises(hf_attention.UnsupportedAttentionError, match=rf"{hf.REFUSED[name]}.*Fix: "):
        model(*llama.decode_batch(model, 2))


def test_an_encoder_served_paged_is_refused_by_name_the_paged_ops_being_causal():
    model = hf.paged_model({"model_type": "bert", **hf.TINY_SHAPE})
    with pytest.raises(hf_attention.UnsupportedAttentionError, match=r"attends both ways.*Fix: .*'split'"):
        model(*llama.decode_batch(model, 2))


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize(("attention", "mode"), [("unified", "FULL"), ("varlen", "FULL_AND_PIECEWISE")])
@pytest.mark.parametrize("name", ["mistral", "gemma2"])
def test_windowed_architectures_served_paged_from_cuda_graphs_equal_their_own_attention(
    name, attention, mode, cuda
):
    """The Triton kernels apply the window and soft-capping inside CUDA graphs: the unified op in FULL graphs
    of every batch, the varlen op in FULL graphs of decodes and its chunked kernel between pieces."""
    model, own = paged_twins(name, "cuda", attention)
    compiled = pieceworks.compile(
        model,
        CompilationConfig(
            splitting_ops=model.config.splitting_ops,
            cudagraph_mode=mode,
            cudagraph_capture_sizes=[1, 4, 8, 16],
        ),
    )

    def serve(ids, positions, uniform):
        with pieceworks.uniform_decode(uniform):
            return compiled(ids, positions)

    with torch.no_grad():
        compiled(*llama.decode_batch(model, 3, "cuda"))
        llama.decode_batch(model, 16, "cuda")  # a uniform decode batch is current while capturing
        compiled.capture()
        check_paged(model, own, serve, "cuda", tolerance=1e-4)
    assert compiled.runtime.captured_sizes == (16, 8, 4, 1)


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("name", ["mistral", "gemma2"])
def test_windowed_architectures_replay_piecewise_cuda_graphs_equal_to_their_own_attention(name, cuda):
    model, own = twins(name, "cuda")
    config = CompilationConfig(splitting_ops=hf.SPLITTING_OPS, cudagraph_capture_sizes=[1, 2, 4, 8])
    compiled = pieceworks.compile(model, config)
    with torch.no_grad():
        compiled(**left_padded(3, seed=0, device="cuda"), use_cache=False)
        compiled.capture()
        check_equal(compiled, own, [3, 1, 5, 8], "cuda")
    assert compiled.runtime.captured_sizes == (8, 4, 2, 1)


# last in the module: its processes run beside the tests above
@pytest.mark.slow
@pytest.mark.inductor
def test_each_architecture_warm_starts_in_a_new_process_without_a_trace(early_processes):
    (proc,) = early_processes.results(test_each_architecture_warm_starts_in_a_new_process_without_a_trace)
    assert proc.returncode == 0, proc.stderr[-4000:]
    cold, warm = json.loads(proc.stdout.splitlines()[-1])
    assert list(cold) == list(warm) == SERVED
    for name in SERVED:
        assert cold[name]["num_dynamo_traces"] == 1, (name, cold[name])
        assert warm[name] == dict.fromkeys(COUNTED, 0) | {"num_traces_reused": 1}, (name, warm[name])
