"""Hugging Face decoders of every architecture in `hf_llama.ARCHITECTURES`, served through the split
route (`attn_implementation="split"`, harness/models/hf_attention.py), equal to the same model run with
transformers' own attention (the one transformers picks for it: SDPA, or eager for Gemma 2), never to a
restatement of it.

Each is called as batched generation calls it: keywords, an `attention_mask` with left-padded rows, several
batch sizes, sequences (SEQ = 8 tokens) longer than the 4-token sliding window of the families that have one.
Equal on the real tokens (a padded position's output is whatever the model makes of a row it masks out). What
the route does not compute is refused by name (`hf_llama.REFUSED`), and docs/your-model.md's table says the
same as the harness. On a GPU, two windowed families are served from PIECEWISE CUDA graphs with the same
result. Needs transformers (the `test` extra installs it); without it every test here is skipped, saying so.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import pieceworks
from pieceworks import CompilationConfig
from pieceworks.harness.models import hf_attention
from pieceworks.harness.models import hf_llama as hf

pytestmark = pytest.mark.skipif(hf.unavailable_reason() is not None, reason=str(hf.unavailable_reason()))

SERVED = [name for name in hf.ARCHITECTURES if name not in hf.REFUSED]


def twins(name: str, device: str = "cpu") -> tuple[torch.nn.Module, torch.nn.Module]:
    """The tiny model of architecture `name` through the split route, and the same weights with the attention
    transformers picks for it."""
    model = hf.causal_lm(hf.tiny_config(name), device)
    transformers = hf_attention.register_attention()
    own = transformers.AutoModelForCausalLM.from_config(hf.tiny_config(name)).to(device).eval()
    own.load_state_dict(model.state_dict())
    assert (
        model.config._attn_implementation
        == {"sdpa": "split", "eager": "split_eager"}[own.config._attn_implementation]
    )
    return model, own


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
