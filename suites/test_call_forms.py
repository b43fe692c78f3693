"""Calls as users make them, outputs as libraries return them.

- Keyword arguments are served: a call is put in the first call's order (positional, then keywords); a call of
  another form is bound by `forward`'s signature, defaults included (a parameter the first call left out must
  keep its default); every argument is checked as a positional one is, and an `InputError` names it by its
  keyword. After the first call no form enters Dynamo.
- Outputs in namedtuples, dataclasses and mappings (a `ModelOutput`-like dataclass whose set fields are its
  items) are served by the compiled graph alone: their types, `None` and constant fields are reproduced, and
  padded rows are cut where the trace has the batch. An output the graph cannot produce (an object) is said at
  WARNING once, with the reason and the fix, and served through Dynamo.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from typing import NamedTuple

import pytest
import torch
import torch.nn as nn

import pieceworks
from pieceworks import CompilationConfig, InputError, counters
from pieceworks.harness.models import toy as models
from pieceworks.padding import unpad

CONFIG = CompilationConfig(splitting_ops=models.SPLITTING_OPS, compiler="eager", cudagraph_mode="NONE")


class Keyed(nn.Module):
    """A forward with defaults and a keyword-only argument, split by the splitting op."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(
        self, x: torch.Tensor, scale: float = 2.0, *, shift: torch.Tensor | None = None, mode: str = "add"
    ) -> torch.Tensor:
        h = self.linear(x)
        out = torch.empty_like(h)
        torch.ops.silly.attention(h, h, h, out)
        y = out * scale + (0 if shift is None else shift)
        return y if mode == "add" else -y


def _inputs(batch: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 4, generator=gen), torch.randn(batch, 4, generator=gen)


def test_keyword_calls_are_served_in_any_form_without_dynamo():
    torch.manual_seed(0)
    model, x, s = Keyed(), *_inputs(3)
    compiled = pieceworks.compile(model, CONFIG)
    torch.testing.assert_close(compiled(x=x, shift=s), model(x=x, shift=s))
    torch._dynamo.reset()  # nothing below may enter Dynamo
    with counters.expect(num_dynamo_traces=0, num_graphs_seen=0, num_backend_compilations=0):
        for batch, call in [
            (5, lambda x, s: compiled(shift=s, x=x)),
            (1, lambda x, s: compiled(x, shift=s)),
            (7, lambda x, s: compiled(x, 2.0, shift=s)),
            (2, lambda x, s: compiled(x, shift=s, mode="add")),
        ]:
            x, s = _inputs(batch, seed=batch)
            torch.testing.assert_close(call(x, s), model(x, shift=s))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda c, x, s: c(x=x, shift=s, mode="neg"),
            "argument mode is 'neg', but the model was compiled with its "
            "default 'add': the first call left it out. Fix:",
        ),
        (
            lambda c, x, s: c(x=x, shift=s, scale=2),
            "argument scale is 2, but the model was compiled with its default 2.0",
        ),
        (
            lambda c, x, s: c(x=x, shift=s.double()),
            "argument shift is Tensor(shape=(3, 4), dtype=torch.float64",
        ),
        (
            lambda c, x, s: c(x=x),
            "argument shift is None (NoneType), but the model was compiled for dtype=torch.float32",
        ),
        (lambda c, x, s: c(shift=s), "missing a required argument: 'x'"),
        (lambda c, x, s: c(x=x, shift=s, bogus=1), "got an unexpected keyword argument 'bogus'"),
        (lambda c, x, s: c(x=x, shift=s[:2]), "disagree on the batch size (dim 0): {'shift': 2, 'x': 3}"),
    ],
)
def test_a_keyword_call_that_does_not_fit_is_an_input_error_naming_the_argument(call, message):
    torch.manual_seed(0)
    x, s = _inputs(3)
    compiled = pieceworks.compile(Keyed(), CONFIG)
    compiled(x=x, shift=s)
    with pytest.raises(InputError) as info:
        call(compiled, x, s)
    assert message in str(info.value), str(info.value)


def test_a_positional_first_call_serves_keyword_calls_and_checks_their_defaults():
    torch.manual_seed(0)
    model, (x, _) = Keyed(), _inputs(4)
    compiled = pieceworks.compile(model, CONFIG)
    compiled(x)
    for call in (lambda: compiled(x=x), lambda: compiled(x, 2.0), lambda: compiled(x, mode="add")):
        torch.testing.assert_close(call(), model(x))
    with pytest.raises(
        InputError, match=r"argument scale is 3\.0, but the model was compiled with its default 2\.0"
    ):
        compiled(x, 3.0)


# ---- outputs -----------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Fields(collections.OrderedDict):
    """Like transformers' `ModelOutput`: a dataclass whose fields that are set are also its items."""

    logits: torch.Tensor | None = None
    loss: torch.Tensor | None = None
    weight: torch.Tensor | None = None

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if getattr(self, field.name) is not None:
                self[field.name] = getattr(self, field.name)


@dataclasses.dataclass(frozen=True)
class Plain:
    hidden: torch.Tensor
    scale: float
    note: str = "ok"
    extra: torch.Tensor | None = None


class Pair(NamedTuple):
    hidden: torch.Tensor
    weight: torch.Tensor


class Structured(nn.Module):
    """One output of each container kind, a [4] weight in each (never cut) and constant fields."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind, self.linear = kind, nn.Linear(4, 4)

    def forward(self, x: torch.Tensor):
        h = self.linear(x)
        out = torch.empty_like(h)
        torch.ops.silly.attention(h, h, h, out)
        weight = self.linear.weight.sum(0) * 1.0  # [4]: dim 0 is not the batch
        if self.kind == "mapping":
            return Fields(logits=out * 2, weight=weight)
        if self.kind == "dataclass":
            return Plain(out, 0.5, extra=None)
        return {"pair": Pair(out + 1, weight), "plain": [Plain(out, 1.5, note="n")]}


def _same(got, expected) -> None:
    assert type(got) is type(expected), (type(got), type(expected))
    if isinstance(expected, torch.Tensor):
        torch.testing.assert_close(got, expected)
    elif isinstance(expected, dict):
        assert list(got.keys()) == list(expected.keys())
        for key in expected:
            _same(got[key], expected[key])
    elif isinstance(expected, (tuple, list)):
        assert len(got) == len(expected)
        for a, b in zip(got, expected):
            _same(a, b)
    elif dataclasses.is_dataclass(expected):
        for field in dataclasses.fields(expected):
            _same(getattr(got, field.name), getattr(expected, field.name))
    else:
        assert got == expected, (got, expected)


@pytest.mark.parametrize("kind", ["mapping", "dataclass", "nested"])
def test_mapping_dataclass_and_namedtuple_outputs_are_served_by_the_graph_alone(kind):
    torch.manual_seed(0)
    model = Structured(kind)
    compiled = pieceworks.compile(model, CONFIG)
    x, _ = _inputs(3)
    _same(compiled(x), model(x))
    assert compiled.binder is not None, "the output's binding was not proven: calls go through Dynamo"
    torch._dynamo.reset()
    with counters.expect(num_dynamo_traces=0, num_graphs_seen=0):
        for batch in (1, 6):
            x, _ = _inputs(batch, seed=batch)
            _same(compiled(x), model(x))


@pytest.mark.parametrize("kind", ["mapping", "dataclass", "nested"])
def test_padded_rows_are_cut_in_every_container_where_the_trace_has_the_batch(kind):
    """At padded size n = 4, `unpad` with the marks taken from the trace cuts each batch-sized output back to
    the batch and leaves the [4] weights whole: the result is eager's at the batch (rows are independent)."""
    torch.manual_seed(0)
    model = Structured(kind)
    compiled = pieceworks.compile(model, CONFIG)
    x, _ = _inputs(4)
    padded = compiled(x)
    for batch in (1, 3, 4):
        _same(unpad(padded, batch, 4, compiled.batched_outputs), model(x[:batch]))


class Holder:
    """Not a tensor, not a container: the graph cannot produce it."""


class ReturnsAnObject(nn.Module):
    def forward(self, x: torch.Tensor):
        out = torch.empty_like(x)
        torch.ops.silly.attention(x, x, x, out)
        return out, Holder()


def test_an_output_the_graph_cannot_produce_is_said_at_warning_once_with_the_fix(caplog):
    caplog.set_level(logging.INFO, logger="pieceworks")
    compiled = pieceworks.compile(ReturnsAnObject(), CONFIG)
    for batch in (3, 1, 5):
        x = torch.randn(batch, 4)
        out, holder = compiled(x)
        torch.testing.assert_close(out, 3 * x)
        assert isinstance(holder, Holder)
    warnings = [
        r.getMessage() for r in caplog.records if r.levelname == "WARNING" and "Dynamo" in r.getMessage()
    ]
    assert len(warnings) == 1 and compiled.binder is None, warnings
    assert (
        "not graph outputs (Holder). Fix: return tensors the model computes, None and constants"
        in warnings[0]
    )
