"""Hugging Face `transformers` models served by pieceworks: built from a `config.json` with random weights (no
download), their attention routed through a splitting op (hf_attention.py: the split and paged routes).

- `load_config(path)`: the config of any decoder the installed transformers knows (Llama, Qwen2/3, Mistral,
  Gemma, ...) from a `config.json` (its file or folder, a dict, or a config), fields overridden by keywords
  (`num_hidden_layers=2`). `CONFIGS` holds shipped ones: `tiny-llama`, `tiny-qwen3`, `tiny-gemma` (2 layers,
  hidden 64: tests and examples) and `qwen3-1.7b` (Qwen3-1.7B's shape: benchmarks).
- `ARCHITECTURES` / `tiny_config(model_type)`: the tiny random configs the split route (hf_attention.py) is
  checked on; `REFUSED`: what the refused ones ask for that the route does not compute.
- `causal_lm(config)`: its `...ForCausalLM`, built on the meta device and initialised in place by
  transformers' own initialisers (seeded), in eval mode, attention the split twin of the one transformers
  picks for it (`"split"`, or `"split_eager"` where transformers runs it eagerly). Call it as transformers
  models are called: `model(input_ids=ids, attention_mask=mask, use_cache=False)` returns a
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
  the module's scaling, causal masking by position, sliding window and logit soft-capping (Gemma 2's), as
  transformers' own attention does.
- The conformance suite's `hf-llama`: `hf_llama(device)` builds `HFLlama` (tiny-llama): `forward(input_ids
  [batch, SEQ])` returns `{"logits": [batch, SEQ, vocab], "hidden_states": ([batch, SEQ, hidden],)}` (nested,
  for output unpadding); `POISON_TOKEN`'s embedding row is NaN, and `hf_llama_inputs` never draws it.
- transformers is the optional extra `hf` (`unavailable_reason()`); importing this module does not import it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from . import hf_attention, llama
from .hf_attention import ATTENTION_NAME, PAGED_ATTENTION_NAME, SPLITTING_OPS, unavailable_reason
from .paged_attention import AttentionMetadata

__all__ = [
    "ARCHITECTURES",
    "ATTENTION_NAME",
    "CONFIGS",
    "HFLlama",
    "KVCache",
    "PAGED_ATTENTION_NAME",
    "POISON_TOKEN",
    "PagedModel",
    "REFUSED",
    "SEQ",
    "SPLITTING_OPS",
    "TINY_SHAPE",
    "causal_lm",
    "hf_llama",
    "hf_llama_inputs",
    "load_config",
    "model_name",
    "paged_model",
    "tiny_config",
    "unavailable_reason",
]

CONFIGS = Path(__file__).with_name("configs")
SEQ = 8
VOCAB = 128
POISON_TOKEN = VOCAB - 1
# The architectures the split route is checked on (suites/test_hf_architectures.py, docs/your-model.md's
# table), by transformers' model_type: tiny random configs built in code, `TINY_SHAPE` with each family's own
# fields (a 4-token sliding window where the family has one: shorter than SEQ, so windows are exercised).
TINY_SHAPE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2)
TINY_SHAPE |= dict(
    num_attention_heads=4, num_key_value_heads=2, bos_token_id=1, eos_token_id=2, pad_token_id=0
)
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {"sliding_window": 4},
    "qwen2": {},
    "qwen3": {"head_dim": 16},
    "phi3": {},
    # a soft-cap that random logits reach (Gemma 2's own, 50, is far above them: it would change nothing)
    "gemma2": {"head_dim": 16, "sliding_window": 4, "attn_logit_softcapping": 0.05},
    "olmo2": {},
    "gpt_neox": {"num_key_value_heads": None},  # a key and value head per query head in this family
    "gpt_oss": {"head_dim": 16, "sliding_window": 4, "num_local_experts": 4, "num_experts_per_tok": 2},
}
# the architectures whose attention asks for what the route does not compute: what, as its refusal names it
REFUSED = {"gpt_oss": "s_aux"}


def tiny_config(model_type: str, **overrides: Any) -> Any:
    """The tiny random config of architecture `model_type` (`ARCHITECTURES`), fields overridden by
    keywords."""
    return load_config({"model_type": model_type, **TINY_SHAPE, **ARCHITECTURES[model_type]}, **overrides)


def model_name(config: Any) -> str:
    """What the model of `config` (`load_config`) is, for people: its architecture and its parameters,
    counted on the meta device ("qwen3 1.72B", "llama 90.4K")."""
    hf = load_config(config)
    with torch.device("meta"):
        model = hf_attention.register_attention().AutoModelForCausalLM.from_config(hf)
    count = sum(p.numel() for p in model.parameters())
    scale, unit = next((s for s in ((1e9, "B"), (1e6, "M"), (1e3, "K")) if count >= s[0]), (1, ""))
    return f"{hf.model_type} {count / scale:.3g}{unit}"


def load_config(config: Any, **overrides: Any) -> Any:
    """The transformers config of `config`: a path to a `config.json` or its folder, a dict of one, or a
    config (copied); `overrides` replace fields. `ValueError` naming the file and the fix where it has no
    `model_type`."""
    transformers = hf_attention.register_attention()
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
        if attention == ATTENTION_NAME:  # the split twin of the attention transformers picks for the model
            own = auto_class.from_config(config, dtype=dtype).config._attn_implementation
            attention = {"eager": "split_eager"}.get(own, attention)
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
        hf_attention.register_attention().AutoModelForCausalLM,
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

    def forward(self, q, k, v, out, scale: float, window: int = 0, softcap: float = 0.0) -> None:
        op = (
            torch.ops.llama.paged_attention_varlen
            if self.attention == "varlen"
            else torch.ops.llama.paged_attention
        )
        op(q, k, v, self.k_cache, self.v_cache, out, scale, window, softcap)


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
    fields = ("num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size")
    if missing := [name for name in fields if not hasattr(hf, name)]:
        raise ValueError(
            f"{config}: a {hf.model_type} config has no {', '.join(missing)}: not a decoder laid out as "
            "transformers' Llama-family decoders, which paged_model serves. Fix: give a decoder's config.json"
        )
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
    transformers = hf_attention.register_attention()
    decoder = _build(transformers.AutoModel, hf, PAGED_ATTENTION_NAME, device, dtype, seed)
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
