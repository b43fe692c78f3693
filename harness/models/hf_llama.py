"""Hugging Face `transformers` models served by pieceworks: built from a `config.json` with random weights (no
download), their attention routed through a splitting op with transformers' `AttentionInterface`.

- `load_config(path)`: the config of any decoder the installed transformers knows (Llama, Qwen2/3, Mistral,
  Gemma, ...) from a `config.json` (its file or folder, a dict, or a config), fields overridden by keywords
  (`num_hidden_layers=2`). `CONFIGS` holds shipped ones: `tiny-llama`, `tiny-qwen3`, `tiny-gemma` (2 layers,
  hidden 64: tests and examples) and `qwen3-1.7b` (Qwen3-1.7B's shape: benchmarks).
- `causal_lm(config)`: its `...ForCausalLM`, built on the meta device and initialised in place by
  transformers' own initialisers (seeded), in eval mode, attention `ATTENTION_NAME`: the splitting op
  `hf_llama::attention(q, k, v, out, scale)`, causal attention over each row's sequence written into `out` (it
  returns nothing, like `silly::attention`, so Meta's pcg can run it; no mask enters the graph, rows are
  independent). Call it as transformers models are called: `model(input_ids=ids, use_cache=False)` returns a
  `CausalLMOutputWithPast`; dim 0 of `ids` is the batch of sequences.
- `paged_model(config)`: the same decoder (`AutoModel`, no lm_head) served as engines serve it, a
  `PagedModel`: `forward(input_ids [T], positions [T])` returns the final hidden states [T, hidden] of T
  tokens from several sequences, as harness/models/llama.py's `Llama` does. Its attention is
  `PAGED_ATTENTION_NAME`: the paged-attention splitting op of paged_attention.py (`llama::paged_attention`, or
  `_varlen`), reading the current `AttentionMetadata` (the model's own, `attn_metadata`, which the batch
  helpers fill and make current) and the layer's KV cache, a `KVCache` submodule of each attention module (its
  buffers are the model's, so pieceworks binds them as any buffer). `config` is a harness `LlamaConfig`
  holding the model's shape and the serving sizes, so llama.py's helpers (`serve_tokens`, `decode_batch`,
  `prefill_batch`) and serving.py's (`KVBlocks`, `step_inputs`) serve it as they serve `Llama`. The op applies
  the module's scaling and causal masking by position; sliding windows and logit soft-capping (Gemma 2) are
  not applied.
- The conformance suite's `hf-llama`: `hf_llama(device)` builds `HFLlama` (tiny-llama): `forward(input_ids
  [batch, SEQ])` returns `{"logits": [batch, SEQ, vocab], "hidden_states": ([batch, SEQ, hidden],)}` (nested,
  for output unpadding); `POISON_TOKEN`'s embedding row is NaN, and `hf_llama_inputs` never draws it.
- transformers is the optional extra `hf` (`unavailable_reason()`); importing this module does not import it.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from . import llama
from .paged_attention import AttentionMetadata

__all__ = [
    "ATTENTION_NAME",
    "CONFIGS",
    "HFLlama",
    "KVCache",
    "PAGED_ATTENTION_NAME",
    "POISON_TOKEN",
    "PagedModel",
    "SEQ",
    "SPLITTING_OPS",
    "causal_lm",
    "hf_llama",
    "hf_llama_inputs",
    "load_config",
    "paged_model",
    "unavailable_reason",
]

ATTENTION_NAME = "pieceworks_split_attention"
PAGED_ATTENTION_NAME = "pieceworks_paged_attention"
SPLITTING_OPS = ["hf_llama::attention"]
CONFIGS = Path(__file__).with_name("configs")
SEQ = 8
VOCAB = 128
POISON_TOKEN = VOCAB - 1

_lib = torch.library.Library("hf_llama", "FRAGMENT")
_lib.define("attention(Tensor q, Tensor k, Tensor v, Tensor(a!) out, float scale) -> ()")


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, scale: float) -> None:
    """Causal scaled-dot-product attention of q [b, heads, s, d] over k, v [b, kv_heads, s, d], written into
    out."""
    out.copy_(
        torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, scale=scale, enable_gqa=True
        )
    )


_lib.impl("attention", _attention, "CompositeExplicitAutograd")


torch.library.register_fake("hf_llama::attention")(lambda q, k, v, out, scale: None)  # writes only into `out`


def split_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function contract: query [b, heads, s, d] -> ([b, s, heads, d], no weights)."""
    out = torch.empty_like(query)
    scale = float(scaling) if scaling is not None else query.shape[-1] ** -0.5
    torch.ops.hf_llama.attention(query, key, value, out, scale)
    return out.transpose(1, 2), None


def paged_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function contract over one sequence of T tokens, the batch's tokens: query [1,
    heads, T, d], key and value [1, kv_heads, T, d] -> ([1, T, heads, d], no weights), through the module's
    `KVCache`."""
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))
    out = torch.empty_like(q)
    module.kv_cache(q, k, v, out, float(scaling) if scaling is not None else q.shape[-1] ** -0.5)
    return out[None], None


def unavailable_reason() -> str | None:
    """None when transformers is importable; else why a Hugging Face model cannot be built, and the fix."""
    if importlib.util.find_spec("transformers") is None:
        return (
            "Hugging Face models need transformers, which is not installed. Fix: pip install 'pieceworks[hf]'"
        )
    return None


def _transformers() -> Any:
    """transformers, with this module's attention functions registered (as attention without a mask function
    of its own: transformers builds no mask for them, the ops mask causally themselves)."""
    reason = unavailable_reason()
    if reason is not None:
        raise ImportError(reason)
    import transformers

    transformers.AttentionInterface.register(ATTENTION_NAME, split_attention_forward)
    transformers.AttentionInterface.register(PAGED_ATTENTION_NAME, paged_attention_forward)
    return transformers


def load_config(config: Any, **overrides: Any) -> Any:
    """The transformers config of `config`: a path to a `config.json` or its folder, a dict of one, or a
    config (copied); `overrides` replace fields. `ValueError` naming the file and the fix where it has no
    `model_type`."""
    transformers = _transformers()
    if isinstance(config, transformers.PretrainedConfig):
        data = config.to_dict()
    elif isinstance(config, dict):
        data = dict(config)
    else:
        path = Path(config) / "config.json" if Path(config).is_dir() else Path(config)
        data = json.loads(path.read_text())
    data.update(overrides)
    model_type = data.pop("model_type", None)
    if not model_type:
        raise ValueError(
            f"{config}: no model_type, so transformers cannot tell which model it configures. Fix: give "
            f"the model's own config.json (its model_type names the family: llama, qwen3, mistral, ...)"
        )
    return transformers.AutoConfig.for_model(model_type, **data)


def _build(
    auto_class: Any, config: Any, attention: str, device: Any, dtype: torch.dtype, seed: int
) -> nn.Module:
    """`auto_class.from_config(config)` with `attention`, built on the meta device (no memory, no
    initialisation), then allocated on `device` and initialised by transformers (seed `seed`), in eval
    mode."""
    with torch.device("meta"):
        model = auto_class.from_config(config, attn_implementation=attention, dtype=dtype)
    model.config._attn_implementation = attention  # older 5.x releases ignore the argument
    model.to_empty(device=device)
    torch.manual_seed(seed)
    model.initialize_weights()
    model.tie_weights()
    return model.eval()


def causal_lm(
    config: Any, device: Any = "cpu", dtype: torch.dtype = torch.float32, seed: int = 0, **overrides: Any
) -> nn.Module:
    """The causal LM of `config` (`load_config(config, **overrides)`), random weights, attention through the
    splitting op `hf_llama::attention` (module doc)."""
    return _build(
        _transformers().AutoModelForCausalLM,
        load_config(config, **overrides),
        ATTENTION_NAME,
        device,
        dtype,
        seed,
    )


class KVCache(nn.Module):
    """One layer's paged KV cache (buffers [num_blocks, block_size, kv_heads, head_dim]); calling it runs the
    paged-attention op `attention` ("unified" or "varlen", paged_attention.py) on it."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, device: Any, attention: str) -> None:
        super().__init__()
        self.attention = attention
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, scale: float
    ) -> None:
        op = (
            torch.ops.llama.paged_attention_varlen
            if self.attention == "varlen"
            else torch.ops.llama.paged_attention
        )
        op(q, k, v, self.k_cache, self.v_cache, out, scale)


class PagedModel(nn.Module):
    """A Hugging Face decoder served on batches of tokens with paged attention (module doc). `layers`: the
    layers' `KVCache`s, in order."""

    decoder: Any  # transformers' model (transformers is optional: its classes are not imported here)

    def __init__(self, decoder: nn.Module, config: llama.LlamaConfig) -> None:
        super().__init__()
        weight = next(decoder.parameters())
        self.decoder, self.config = decoder, config
        # the host's block tables stay on the host
        self.attn_metadata = AttentionMetadata(config).to(weight.device)
        attention = [m for m in decoder.modules() if hasattr(m, "layer_idx") and hasattr(m, "is_causal")]
        if len(attention) != config.num_layers:
            raise ValueError(
                f"found {len(attention)} attention modules (with layer_idx and is_causal) in "
                f"{type(decoder).__name__}, which has {config.num_layers} layers: this model family's "
                f"attention is not laid out as transformers' decoders are"
            )
        for module in attention:
            module.kv_cache = KVCache(
                (config.num_blocks, config.block_size, config.num_kv_heads, config.head_dim),
                weight.dtype,
                weight.device,
                config.attention,
            )

    @property
    def layers(self) -> list[KVCache]:
        return [kv for m in self.decoder.modules() if isinstance(kv := getattr(m, "kv_cache", None), KVCache)]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        out = self.decoder(input_ids=input_ids[None], position_ids=positions[None], use_cache=False)
        return out.last_hidden_state[0]


def paged_model(
    config: Any,
    device: Any = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    serving: dict[str, Any] | None = None,
    **overrides: Any,
) -> PagedModel:
    """The `PagedModel` of `config` (`load_config(config, **overrides)`), random weights; `serving` sets the
    batch and cache sizes and the attention op (`LlamaConfig` fields: `max_tokens`, `max_seqs`,
    `max_blocks_per_seq`, `block_size`, `cache_blocks`, `attention`; default TINY's)."""
    hf = load_config(config, **overrides)
    heads = hf.num_attention_heads
    shape = llama.LlamaConfig(
        num_layers=hf.num_hidden_layers,
        hidden_size=hf.hidden_size,
        num_heads=heads,
        num_kv_heads=getattr(hf, "num_key_value_heads", None) or heads,
        head_dim=getattr(hf, "head_dim", None) or hf.hidden_size // heads,
        intermediate_size=hf.intermediate_size,
        vocab_size=hf.vocab_size,
        norm_eps=getattr(hf, "rms_norm_eps", 0.0),
        rope_theta=float((getattr(hf, "rope_parameters", None) or {}).get("rope_theta", 0.0)),
    )
    serving = {
        name: getattr(llama.TINY, name)
        for name in ("block_size", "max_blocks_per_seq", "max_tokens", "max_seqs")
    } | (serving or {})
    decoder = _build(_transformers().AutoModel, hf, PAGED_ATTENTION_NAME, device, dtype, seed)
    return PagedModel(decoder, dataclasses.replace(shape, **serving))


class HFLlama(nn.Module):
    """`LlamaForCausalLM` called for its logits and last hidden state, without a KV cache."""

    causal_lm: Any  # transformers' model (transformers is optional: its classes are not imported here)

    def __init__(self, causal_lm: nn.Module) -> None:
        super().__init__()
        self.causal_lm = causal_lm

    def forward(self, input_ids: torch.Tensor) -> dict:
        hidden = self.causal_lm.model(input_ids=input_ids, use_cache=False).last_hidden_state
        return {"logits": self.causal_lm.lm_head(hidden), "hidden_states": (hidden,)}


def hf_llama(device: str | torch.device = "cpu", layers: int = 2, seed: int = 0) -> HFLlama:
    """The tiny-llama config's model (hidden 64, 4 query heads over 2 key/value heads, vocab 128), eval
    mode."""
    model = causal_lm(CONFIGS / "tiny-llama.json", device, seed=seed, num_hidden_layers=layers)
    with torch.no_grad():
        model.get_parameter("model.embed_tokens.weight")[POISON_TOKEN] = float("nan")
    return HFLlama(model)


def hf_llama_inputs(batch: int, seed: int = 0, device: str | torch.device = "cpu") -> tuple[torch.Tensor]:
    """Token ids [batch, SEQ], never POISON_TOKEN."""
    gen = torch.Generator().manual_seed(seed)
    return (torch.randint(0, POISON_TOKEN, (batch, SEQ), generator=gen).to(device),)
