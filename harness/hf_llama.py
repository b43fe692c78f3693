"""A Hugging Face `transformers` Llama from a tiny config with random weights (no download), its attention routed
through a splitting op: the conformance suite's realistic model.

- `hf_llama(device)` builds `HFLlama`: `forward(input_ids [batch, SEQ])` returns `{"logits": [batch, SEQ, vocab],
  "hidden_states": ([batch, SEQ, hidden],)}` (nested, for output unpadding); dim 0 is the batch, SEQ is fixed.
- Attention is `ATTENTION_NAME`, registered with transformers' `AttentionInterface`. It calls the splitting op
  `hf_llama::attention(q, k, v, out, scale)`, which writes causal attention into `out` and returns nothing, like
  `silly::attention` (so Meta's pcg can run it). No mask enters the graph; rows are independent.
- `POISON_TOKEN`: its embedding row is NaN; `hf_llama_inputs` never draws it.
- transformers is the optional extra `hf` (`unavailable_reason()`); importing this module does not import it.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn as nn

__all__ = ["ATTENTION_NAME", "SPLITTING_OPS", "SEQ", "POISON_TOKEN", "HFLlama", "hf_llama", "hf_llama_inputs",
           "unavailable_reason"]

ATTENTION_NAME = "pieceworks_split_attention"
SPLITTING_OPS = ["hf_llama::attention"]
SEQ = 8
VOCAB = 128
POISON_TOKEN = VOCAB - 1

_lib = torch.library.Library("hf_llama", "FRAGMENT")
_lib.define("attention(Tensor q, Tensor k, Tensor v, Tensor(a!) out, float scale) -> ()")


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, scale: float) -> None:
    """Causal scaled-dot-product attention of q [b, heads, s, d] over k, v [b, kv_heads, s, d], written into out."""
    out.copy_(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=True))


_lib.impl("attention", _attention, "CompositeExplicitAutograd")


torch.library.register_fake("hf_llama::attention")(lambda q, k, v, out, scale: None)  # writes only into `out`


def split_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function contract: query [b, heads, s, d] -> ([b, s, heads, d], no weights)."""
    out = torch.empty_like(query)
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    torch.ops.hf_llama.attention(query, key, value, out, scale)
    return out.transpose(1, 2), None


def unavailable_reason() -> str | None:
    """None when transformers is importable; else why the HF Llama cannot be built, and the fix."""
    if importlib.util.find_spec("transformers") is None:
        return "the HF Llama needs transformers, which is not installed. Fix: pip install 'pieceworks[hf]'"
    return None


class HFLlama(nn.Module):
    """`LlamaForCausalLM` called for its logits and last hidden state, without a KV cache."""

    def __init__(self, causal_lm: nn.Module) -> None:
        super().__init__()
        self.causal_lm = causal_lm

    def forward(self, input_ids: torch.Tensor) -> dict:
        hidden = self.causal_lm.model(input_ids=input_ids, use_cache=False).last_hidden_state
        return {"logits": self.causal_lm.lm_head(hidden), "hidden_states": (hidden,)}


def hf_llama(device: str | torch.device = "cpu", layers: int = 2, seed: int = 0) -> HFLlama:
    """A tiny random-weight Llama (hidden 64, 4 query heads over 2 key/value heads, vocab 128), eval mode."""
    reason = unavailable_reason()
    if reason is not None:
        raise ImportError(reason)
    from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM

    AttentionInterface.register(ATTENTION_NAME, split_attention_forward)
    config = LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=4 * SEQ, tie_word_embeddings=False,
        attn_implementation=ATTENTION_NAME,
    )
    torch.manual_seed(seed)
    causal_lm = LlamaForCausalLM(config)
    causal_lm.config._attn_implementation = ATTENTION_NAME  # older 5.x releases ignore the constructor argument
    with torch.no_grad():
        causal_lm.model.embed_tokens.weight[POISON_TOKEN] = float("nan")
    return HFLlama(causal_lm).to(device).eval()


def hf_llama_inputs(batch: int, seed: int = 0, device: str | torch.device = "cpu") -> tuple[torch.Tensor]:
    """Token ids [batch, SEQ], never POISON_TOKEN."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(0, POISON_TOKEN, (batch, SEQ), generator=gen).to(device),)
