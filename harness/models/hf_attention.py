"""The attention functions transformers calls in a Hugging Face model served by pieceworks: routes from the
model's attention layers to a splitting op, registered with transformers (`register_attention()`).

- The split route: `attn_implementation="split"` computes what transformers' "sdpa" computes, `"split_eager"`
  what "eager" does (for models transformers runs eagerly, e.g. Gemma 2's soft-capping), through the splitting
  op `hf_llama::attention(q, k, v, mask, out, scale, is_causal, softcap, function)`, which runs transformers'
  own attention function (`sdpa_attention_forward`, or the model's `eager_attention_forward`) on the mask
  transformers' own mask function built for that name (`sdpa_mask`, `eager_mask`: padding, causal, sliding
  window). What a layer asks for that it does not compute (an argument outside `COMPUTED`, dropout) is refused
  by name at the first call (`UnsupportedAttentionError`).
- The paged route (`PAGED_ATTENTION_NAME`): the tokens of many sequences as one sequence, through the layer's
  `KVCache` (hf_llama.py) and the paged-attention ops of paged_attention.py, which mask by position (causal,
  the layer's sliding window) and apply the layer's soft-capping; no mask function is registered for it.
  Both routes refuse what they do not compute, by name.
- transformers is the optional extra `hf` (`unavailable_reason()`); importing this module does not import it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import types
from typing import Any

import torch

# attn_implementation names of the split route, and the attention of transformers' own each computes
SPLIT_ROUTES = {"split": "sdpa", "split_eager": "eager"}
ATTENTION_NAME = "split"
PAGED_ATTENTION_NAME = "pieceworks_paged_attention"
SPLITTING_OPS = ["hf_llama::attention"]

# what transformers hands an attention function besides the tensors that the route computes: the sliding
# window is in the mask transformers builds, positions were applied before (rotary), softcap enters the op;
# the call's output flags (attention weights: none, as transformers' sdpa; refused where eager returns them)
COMPUTED = frozenset(
    {"sliding_window", "softcap", "position_ids", "cache_position", "use_cache", "is_causal"}
)
COMPUTED |= {"output_hidden_states", "output_attentions"}

_lib = torch.library.Library("hf_llama", "FRAGMENT")
_lib.define(
    "attention(Tensor q, Tensor k, Tensor v, Tensor? mask, Tensor(a!) out, float scale, bool is_causal, "
    "float? softcap, str function) -> ()"
)


class UnsupportedAttentionError(ValueError):
    """A model's attention asks for something the split route does not compute; the message names it and
    the fix."""


def _attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    out: torch.Tensor,
    scale: float,
    is_causal: bool,
    softcap: float | None,
    function: str,
) -> None:
    """transformers' own attention of q [b, heads, s, d] over k, v [b, kv_heads, s, d] with the mask
    transformers built, written into out [b, s, heads, d]: `function` "sdpa" runs `sdpa_attention_forward`,
    another names the modeling module whose `eager_attention_forward` runs (with `softcap`), on a stand-in
    of the layer (`_layer`)."""
    layer, attend = _layer(q.shape[1] // k.shape[1], q.shape[-1]), _function(function)
    if function == "sdpa":
        found = attend(layer, q, k, v, mask, scaling=scale, is_causal=is_causal)
    else:
        found = attend(layer, q, k, v, mask, scaling=scale, softcap=softcap)
    out.copy_(found[0])


@functools.cache
def _function(function: str) -> Any:
    """The attention function `function` names (see `_attention`), resolved once: the op runs per layer and
    per call."""
    if function == "sdpa":
        return importlib.import_module("transformers.integrations.sdpa_attention").sdpa_attention_forward
    return importlib.import_module(function).eager_attention_forward


@functools.cache
def _layer(groups: int, head_dim: int) -> Any:
    """The stand-in for the layer transformers' attention functions read: query heads per key/value head,
    eval mode, head size."""
    return types.SimpleNamespace(num_key_value_groups=groups, training=False, head_dim=head_dim)


_lib.impl("attention", _attention, "CompositeExplicitAutograd")
torch.library.register_fake("hf_llama::attention")(lambda *args: None)  # writes only into `out`


def _checked(module: Any, head_dim: int, dropout: float, scaling: Any, kwargs: dict) -> tuple[float, bool]:
    """The scale and causality a layer's call asks for; `UnsupportedAttentionError` where it asks for what the
    routes do not compute (dropout, an argument outside `COMPUTED`)."""
    if dropout:
        raise UnsupportedAttentionError("attention dropout (a model in training mode). Fix: model.eval()")
    if other := sorted(k for k, v in kwargs.items() if v is not None and k not in COMPUTED):
        raise UnsupportedAttentionError(
            f"{type(module).__name__} passes {other} to its attention, which pieceworks' attention routes do "
            f"not compute. Fix: serve this model with its own attention (torch.compile), or extend the route"
        )
    scale = float(scaling) if scaling is not None else head_dim**-0.5
    return scale, bool(kwargs.get("is_causal", getattr(module, "is_causal", True)))


def split_attention(base: str) -> Any:
    """The attention function of route `base` ("sdpa" or "eager"): transformers' contract (query [b, heads,
    s, d] -> ([b, s, heads, d], no weights)), computed by `hf_llama::attention` as transformers' `base`
    attention computes it; what it does not compute is refused by name (`UnsupportedAttentionError`)."""

    def split_attention_forward(
        module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs
    ):
        scale, is_causal = _checked(module, query.shape[-1], dropout, scaling, kwargs)
        if base == "eager" and kwargs.get("output_attentions"):
            raise UnsupportedAttentionError(
                "attention weights (output_attentions=True), which transformers' eager attention returns and "
                "the split route does not. Fix: call without output_attentions"
            )
        if base == "sdpa" and kwargs.get("softcap") is not None:
            raise UnsupportedAttentionError(
                f"logit soft-capping (softcap={kwargs['softcap']}), which transformers' sdpa attention does "
                "not compute either. Fix: attn_implementation='split_eager' (transformers runs it eagerly)"
            )
        b, heads, s, _ = query.shape
        out = query.new_empty((b, s, heads, value.shape[-1]))  # contiguous, as the op's fake promises
        function = "sdpa" if base == "sdpa" else type(module).__module__
        torch.ops.hf_llama.attention(
            query, key, value, attention_mask, out, scale, is_causal, kwargs.get("softcap"), function
        )
        return out, None

    return split_attention_forward


def paged_attention_forward(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention-function contract over one sequence of T tokens, the batch's tokens: query [1,
    heads, T, d], key and value [1, kv_heads, T, d] -> ([1, T, heads, d], no weights), through the module's
    `KVCache`, with the layer's sliding window and soft-capping; a layer that attends both ways is refused
    (the paged ops are causal by position)."""
    scale, is_causal = _checked(module, query.shape[-1], dropout, scaling, kwargs)
    if not is_causal:
        raise UnsupportedAttentionError(
            f"{type(module).__name__} attends both ways (is_causal=False); the paged route is causal. Fix: "
            "serve it with attn_implementation='split', which computes it as transformers does"
        )
    q, k, v = (t[0].transpose(0, 1).contiguous() for t in (query, key, value))
    out = torch.empty_like(q)
    module.kv_cache(q, k, v, out, scale, kwargs.get("sliding_window") or 0, kwargs.get("softcap") or 0.0)
    return out[None], None


def unavailable_reason() -> str | None:
    """None when transformers is importable; else why a Hugging Face model cannot be built, and the fix."""
    if importlib.util.find_spec("transformers") is None:
        return (
            "Hugging Face models need transformers, which is not installed. Fix: pip install 'pieceworks[hf]'"
        )
    return None


def register_attention() -> Any:
    """transformers, with this module's routes registered: `attn_implementation="split"` computes what
    "sdpa" does, `"split_eager"` what "eager" does (for models transformers runs eagerly, e.g. Gemma 2's
    soft-capping), each with transformers' own mask function of that attention (padding, causal and
    sliding-window masks); and the paged route (no mask function: the paged ops mask by position)."""
    reason = unavailable_reason()
    if reason is not None:
        raise ImportError(reason)
    import transformers

    for name, base in SPLIT_ROUTES.items():
        transformers.AttentionInterface.register(name, split_attention(base))
        transformers.AttentionMaskInterface.register(
            name, getattr(transformers.masking_utils, f"{base}_mask")
        )
    transformers.AttentionInterface.register(PAGED_ATTENTION_NAME, paged_attention_forward)
    return transformers
