"""The models of the conformance suite, each with its inputs, its splitting ops, a way to poison rows, and where it
has one a closed form.

Every model keeps dim 0 of every argument as the batch, and its rows independent of each other (so a poisoned row can
only show in its own output row). Integer inputs cannot hold NaN: the token-id models reserve `POISON_TOKEN`, whose
embedding row is NaN, and never draw it for real rows.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from pieceworks.harness import hf_llama as hf
from pieceworks.harness import llama
from pieceworks.harness import models

__all__ = ["ModelCase", "CASES", "POISONS"]

POISONS = (float("nan"), float("inf"), float("-inf"))
_TOY = models.ToyLlamaConfig(num_layers=2)
_TOY_POISON = _TOY.vocab_size - 1


@dataclasses.dataclass(frozen=True)
class ModelCase:
    """`make(device)` -> eager module; `inputs(batch, seed, device)` -> argument tuple; `poison(args, rows, value)`
    -> args with `rows` (a slice or index tensor) poisoned (NaN/inf for float arguments, the NaN token for token ids);
    `closed_form(args)` -> the exact output, or None; `unavailable()` -> why the model cannot be built here, or None."""

    name: str
    splitting_ops: tuple[str, ...]
    make: Callable[[torch.device], torch.nn.Module]
    inputs: Callable[[int, int, torch.device], tuple]
    poison: Callable[[tuple, Any, float], tuple]
    closed_form: Callable[[tuple], torch.Tensor] | None = None
    unavailable: Callable[[], str | None] = lambda: None


# ---- SillyModel: x -> 9x + 19 ------------------------------------------------------------------------------------
def _silly_inputs(batch: int, seed: int, device: torch.device) -> tuple:
    return (torch.randn(batch, generator=torch.Generator().manual_seed(seed)).to(device),)


def _poison_floats(args: tuple, rows: Any, value: float) -> tuple:
    out = tuple(a.clone() for a in args)
    for a in out:
        if a.is_floating_point():
            a[rows] = value
    return out


# ---- ToyLlama (random weights, and the tractable identity variant) --------------------------------------------------
def _toy(tractable: bool) -> Callable[[torch.device], torch.nn.Module]:
    def make(device: torch.device) -> torch.nn.Module:
        torch.manual_seed(0)
        model = models.tractable_toy_llama(_TOY) if tractable else models.ToyLlama(_TOY)
        with torch.no_grad():
            model.embed_tokens.weight[_TOY_POISON] = float("nan")
        return model.to(device)

    return make


def _toy_inputs(batch: int, seed: int, device: torch.device) -> tuple:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, _TOY_POISON, (batch,), generator=gen)
    positions = torch.randint(0, 4, (batch,), generator=gen)
    return ids.to(device), positions.to(device)


def _poison_tokens(token: int) -> Callable[[tuple, Any, float], tuple]:
    def poison(args: tuple, rows: Any, value: float) -> tuple:
        out = tuple(a.clone() for a in args)
        out[0][rows] = token  # NaN whatever `value` asks for: an embedding row holds one value
        return out

    return poison


def _tractable_closed_form(args: tuple) -> torch.Tensor:
    return models.tractable_expected(args[1], _TOY).to(args[1].device, torch.float32)


# ---- Llama (TINY) with paged-KV attention: every row a decode token of its own sequence ------------------------------
# Row i is always the next token of sequence i, at position `_llama_positions[i]`: its context (the positions before)
# is prefilled once by `make` and never written again, and each call writes only its own slot before reading it, so a
# row depends on its token alone, not on earlier calls (poisoned ones included). The metadata of every row is filled
# once (`decode_batch` of max_tokens rows) and stays current: a call of b rows reads the first b rows (pad rows too).
_LLAMA = llama.TINY
_LLAMA_POISON = _LLAMA.vocab_size - 1
_llama_positions = torch.arange(_LLAMA.max_tokens) * 7 % _LLAMA.max_context


def _llama(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    model = llama.Llama(_LLAMA)
    with torch.no_grad():
        model.tok_embeddings.weight[_LLAMA_POISON] = float("nan")
        model.to(device)
        for seq, position in enumerate(_llama_positions.tolist()):
            if position:
                model(*llama.prefill_batch(model, position, device, seed=seq, seq=seq))
    llama.decode_batch(model, _LLAMA.max_tokens, device, positions=_llama_positions)
    return model


def _llama_inputs(batch: int, seed: int, device: torch.device) -> tuple:
    ids = torch.randint(0, _LLAMA_POISON, (batch,), generator=torch.Generator().manual_seed(seed))
    return ids.to(device), _llama_positions[:batch].to(device)


CASES: dict[str, ModelCase] = {case.name: case for case in [
    ModelCase("silly", tuple(models.SPLITTING_OPS), lambda device: models.SillyModel().to(device), _silly_inputs,
              _poison_floats, closed_form=lambda args: models.silly_model_expected(args[0])),
    ModelCase("toy-llama", tuple(models.SPLITTING_OPS), _toy(False), _toy_inputs, _poison_tokens(_TOY_POISON)),
    ModelCase("toy-llama-tractable", tuple(models.SPLITTING_OPS), _toy(True), _toy_inputs,
              _poison_tokens(_TOY_POISON), closed_form=_tractable_closed_form),
    ModelCase("hf-llama", tuple(hf.SPLITTING_OPS), lambda device: hf.hf_llama(device),
              lambda batch, seed, device: hf.hf_llama_inputs(batch, seed, device), _poison_tokens(hf.POISON_TOKEN),
              unavailable=hf.unavailable_reason),
    ModelCase("llama", tuple(llama.SPLITTING_OPS), _llama, _llama_inputs, _poison_tokens(_LLAMA_POISON)),
]}
