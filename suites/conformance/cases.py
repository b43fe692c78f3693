"""The models of the conformance suite, each with its inputs, its splitting ops, a way to poison rows, and
where it has one a closed form. `case(name)`: a model of `CASES` by name, or any Hugging Face decoder from the
path of its `config.json` (`config_case`: served as `llama` is, with paged attention).

Every model keeps dim 0 of every argument as the batch, and its rows independent of each other (so a poisoned
row can only show in its own output row). Integer inputs cannot hold NaN: the token-id models reserve
`POISON_TOKEN`, whose embedding row is NaN, and never draw it for real rows. `silly-inplace` writes into its
argument (the property argument-writes-reach-the-caller needs such a model); the others write none of theirs.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from pieceworks.harness.models import hf_llama as hf
from pieceworks.harness.models import llama
from pieceworks.harness.models import toy as models

__all__ = ["ModelCase", "CASES", "POISONS", "case", "config_case"]

POISONS = (float("nan"), float("inf"), float("-inf"))
_TOY = models.ToyLlamaConfig(num_layers=2)
_TOY_POISON = _TOY.vocab_size - 1


@dataclasses.dataclass(frozen=True)
class ModelCase:
    """`make(device)` -> eager module; `inputs(batch, seed, device)` -> argument tuple; `poison(args, rows,
    value)` -> args with `rows` (a slice or index tensor) poisoned (NaN/inf for float arguments, the NaN token
    for token ids); `closed_form(args)` -> the exact output, or None; `unavailable()` -> why the model cannot
    be built here, or None; `max_batch`: the largest batch the model serves (None: any); `writes_arguments`:
    the model writes its arguments in place."""

    name: str
    splitting_ops: tuple[str, ...]
    make: Callable[[torch.device], torch.nn.Module]
    inputs: Callable[[int, int, torch.device], tuple]
    poison: Callable[[tuple, Any, float], tuple]
    closed_form: Callable[[tuple], torch.Tensor] | None = None
    unavailable: Callable[[], str | None] = lambda: None
    max_batch: int | None = None
    writes_arguments: bool = False


# ---- SillyModel: x -> 9x + 19 ------------------------------------------------------------------------------
def _silly_inputs(batch: int, seed: int, device: torch.device) -> tuple:
    return (torch.randn(batch, generator=torch.Generator().manual_seed(seed)).to(device),)


def _poison_floats(args: tuple, rows: Any, value: float) -> tuple:
    out = tuple(a.clone() for a in args)
    for a in out:
        if a.is_floating_point():
            a[rows] = value
    return out


class WritesItsArgument(torch.nn.Module):
    """SillyModel after writing |x| into its argument in place: returns 9|x| + 19 and leaves |x| in x. The
    write is idempotent, so calling again on the same tensor gives the same output."""

    def __init__(self) -> None:
        super().__init__()
        self.silly = models.SillyModel()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.abs_()
        return self.silly(x)


# ---- ToyLlama (random weights, and the tractable identity variant) -----------------------------------------
def _toy(tractable: bool, dtype: torch.dtype = torch.float32) -> Callable[[torch.device], torch.nn.Module]:
    def make(device: torch.device) -> torch.nn.Module:
        torch.manual_seed(0)
        model = models.tractable_toy_llama(_TOY) if tractable else models.ToyLlama(_TOY)
        with torch.no_grad():
            model.embed_tokens.weight[_TOY_POISON] = float("nan")
        return model.to(device, dtype)

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


# ---- Llama with paged-KV attention: TINY on CPU; on CUDA Llama-3.2-1B's layer shapes (2 of its 16 layers) --
# Row i is always the next token of sequence i, at position `_positions(config)[i]`: its context (the
# positions before) is prefilled once by `make` and never written again, and each call writes only its own
# slot before reading it, so a row depends on its token alone, not on earlier calls (poisoned ones included).
# The metadata of every row is filled once (`decode_batch` of max_tokens rows) and stays current: a call of b
# rows reads the first b rows (pad rows too). A batch serves at most _LLAMA_ROWS rows (its sequences).
_LLAMA_ROWS = llama.TINY.max_tokens


def _llama_config(device: torch.device) -> llama.LlamaConfig:
    return (
        llama.TINY
        if torch.device(device).type == "cpu"
        else dataclasses.replace(llama.LLAMA_1B, num_layers=2, max_tokens=_LLAMA_ROWS, max_blocks_per_seq=4)
    )


def _positions(config: llama.LlamaConfig) -> torch.Tensor:
    return torch.arange(config.max_tokens) * 7 % config.max_context


def _served(
    model: llama.Llama | hf.PagedModel, embedding: torch.Tensor, device: torch.device
) -> torch.nn.Module:
    """`model` (a Llama, or a paged Hugging Face model) with its last token's embedding row NaN, every row's
    context prefilled, and the metadata of `max_tokens` decode rows current."""
    config = model.config
    with torch.no_grad():
        embedding[config.vocab_size - 1] = float("nan")
        model.to(device)
        for seq, position in enumerate(_positions(config).tolist()):
            if position:
                model(*llama.prefill_batch(model, position, device, seed=seq, seq=seq))
    llama.decode_batch(model, config.max_tokens, device, positions=_positions(config))
    return model


def _llama(device: torch.device) -> torch.nn.Module:
    torch.manual_seed(0)
    model = llama.Llama(_llama_config(device))
    return _served(model, model.tok_embeddings.weight, device)


def _token_inputs(config: llama.LlamaConfig) -> Callable[[int, int, torch.device], tuple]:
    def inputs(batch: int, seed: int, device: torch.device) -> tuple:
        ids = torch.randint(0, config.vocab_size - 1, (batch,), generator=torch.Generator().manual_seed(seed))
        return ids.to(device), _positions(config)[:batch].to(device)

    return inputs


def _llama_inputs(batch: int, seed: int, device: torch.device) -> tuple:
    return _token_inputs(_llama_config(device))(batch, seed, device)


def _llama_poison(args: tuple, rows: Any, value: float) -> tuple:
    return _poison_tokens(_llama_config(args[0].device).vocab_size - 1)(args, rows, value)


@functools.cache
def config_case(path: str) -> ModelCase:
    """The Hugging Face decoder of the `config.json` at `path` (`hf_llama.paged_model`: random weights, paged
    attention through `llama::paged_attention`, TINY's batch and cache sizes), served as `llama` is: row i the
    next token of sequence i over a prefilled context. Named by `path`; unavailable without transformers."""
    if hf.unavailable_reason() is None:
        config = dataclasses.replace(llama.TINY, vocab_size=hf.load_config(path).vocab_size)
    else:
        config = llama.TINY

    def make(device: torch.device) -> torch.nn.Module:
        model = hf.paged_model(path, device)
        return _served(model, model.decoder.get_input_embeddings().weight, device)

    return ModelCase(
        path,
        (llama.SPLITTING_OPS[0],),
        make,
        _token_inputs(config),
        _poison_tokens(config.vocab_size - 1),
        unavailable=hf.unavailable_reason,
        max_batch=config.max_tokens,
    )


def case(name: str) -> ModelCase:
    """The model `name` of `CASES`, or for the path of a Hugging Face `config.json`, its `config_case`;
    `ValueError` naming the models and the fix otherwise."""
    if name in CASES:
        return CASES[name]
    if name.endswith(".json"):
        if not Path(name).is_file():
            raise ValueError(
                f"no file {name}: --conformance-model takes a model of the suite or the path of a Hugging "
                f"Face config.json. Fix: give an existing file"
            )
        return config_case(name)
    raise ValueError(
        f"unknown conformance model {name!r}; the suite has {list(CASES)} (or 'all'), or give the path of "
        f"a Hugging Face config.json"
    )


CASES: dict[str, ModelCase] = {
    case.name: case
    for case in [
        ModelCase(
            "silly",
            tuple(models.SPLITTING_OPS),
            lambda device: models.SillyModel().to(device),
            _silly_inputs,
            _poison_floats,
            closed_form=lambda args: models.silly_model_expected(args[0]),
        ),
        ModelCase(
            "silly-inplace",
            tuple(models.SPLITTING_OPS),
            lambda device: WritesItsArgument().to(device),
            _silly_inputs,
            _poison_floats,
            closed_form=lambda args: models.silly_model_expected(args[0].abs()),
            writes_arguments=True,
        ),
        ModelCase(
            "toy-llama", tuple(models.SPLITTING_OPS), _toy(False), _toy_inputs, _poison_tokens(_TOY_POISON)
        ),
        ModelCase(
            "toy-llama-bf16",
            tuple(models.SPLITTING_OPS),
            _toy(False, torch.bfloat16),
            _toy_inputs,
            _poison_tokens(_TOY_POISON),
        ),
        ModelCase(
            "toy-llama-tractable",
            tuple(models.SPLITTING_OPS),
            _toy(True),
            _toy_inputs,
            _poison_tokens(_TOY_POISON),
            closed_form=_tractable_closed_form,
        ),
        ModelCase(
            "hf-llama",
            tuple(hf.SPLITTING_OPS),
            lambda device: hf.hf_llama(device),
            lambda batch, seed, device: hf.hf_llama_inputs(batch, seed, device),
            _poison_tokens(hf.POISON_TOKEN),
            unavailable=hf.unavailable_reason,
        ),
        ModelCase(
            "llama", tuple(llama.SPLITTING_OPS), _llama, _llama_inputs, _llama_poison, max_batch=_LLAMA_ROWS
        ),
    ]
}
