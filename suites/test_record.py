"""The serving record: a first call of a cached model is served without tracing, and never when anything that
changes its code has changed (its source, its attributes, its state's shapes, the call's signature)."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
import torch
import torch.nn as nn

import pieceworks
from pieceworks import CompilationConfig, counters, record
from pieceworks.harness import models  # noqa: F401 - registers silly::attention

pytestmark = pytest.mark.inductor


class Scaled(nn.Module):
    """A parameter, a buffer, a plain attribute the trace bakes in, the splitting op, and an argument written in
    place."""

    def __init__(self, scale: float = 2.0) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.register_buffer("shift", torch.ones(4))
        self.scale = scale

    def forward(self, x: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        seen.add_(1)
        h = self.linear(x) * self.scale
        out = torch.empty_like(h)
        torch.ops.silly.attention(h, h, self.shift.expand_as(h), out)
        return out - 1


def _compile(model, cache_dir, **kwargs):
    return pieceworks.compile(model, CompilationConfig(splitting_ops=["silly::attention"], cudagraph_mode="NONE",
                                                       cache_dir=str(cache_dir), **kwargs))


def _check(compiled, model, batches=(1, 5, 3)):
    """Every batch as the eager model computes it, the argument written as the eager model writes it."""
    with torch.no_grad():
        for batch in batches:
            x = torch.randn(batch, 4)
            # a column: not contiguous, so the compiled model writes a copy and must copy it back
            seen, seen_eager = torch.zeros(batch, 2)[:, 0], torch.zeros(batch)
            torch.testing.assert_close(compiled(x, seen), model(x, seen_eager))
            torch.testing.assert_close(seen, seen_eager)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """A cache holding `Scaled()`'s pieces and serving record."""
    root = tmp_path_factory.mktemp("record-cache")
    torch.manual_seed(0)
    model = Scaled()
    with counters.expect(num_dynamo_traces=1, num_traces_reused=0):
        _check(_compile(model, root), model)
    return root


def test_a_cached_model_is_served_without_tracing_or_compiling(cache_dir):
    model = Scaled()  # other weights: the record binds this model's own parameters
    with counters.expect(num_dynamo_traces=0, num_traces_reused=1, num_inductor_compiles=0):
        compiled = _compile(model, cache_dir)
        _check(compiled, model)
    with torch.no_grad():  # in-place weight loads are served, as after a traced first call
        model.linear.weight.mul_(-1)
    _check(compiled, model, batches=(2,))


def test_off_every_first_call_traces(cache_dir):
    model = Scaled()
    with counters.expect(num_dynamo_traces=1, num_traces_reused=0, num_inductor_compiles=0):
        _check(_compile(model, cache_dir, reuse_trace=False), model)


def test_a_damaged_record_is_reported_traced_and_replaced(cache_dir, caplog):
    (folder,) = [d for d in os.listdir(cache_dir) if d.startswith("model-")]
    artifacts = os.path.join(cache_dir, folder, "artifacts")
    (name,) = os.listdir(artifacts)
    path = os.path.join(artifacts, name)
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    caplog.set_level("WARNING", logger="pieceworks")
    model = Scaled()
    with counters.expect(num_dynamo_traces=1, num_traces_reused=0, num_inductor_compiles=0):
        _check(_compile(model, cache_dir), model)
    assert path in caplog.text
    with counters.expect(num_dynamo_traces=0, num_traces_reused=1):  # the trace stored a sound record again
        _check(_compile(model, cache_dir), model)


@pytest.mark.parametrize("change", ["attribute", "shape", "dtype", "submodule", "buffer", "call", "config"])
def test_the_key_moves_with_what_changes_code(change):
    torch.manual_seed(0)
    base = Scaled()
    config = CompilationConfig(splitting_ops=["silly::attention"])
    call = [pieceworks.api.signature(a) for a in (torch.zeros(2, 4), torch.zeros(2))]
    key = record.model_key(base, call, config)
    assert record.model_key(Scaled(), call, config) == key, "new weights of the same shapes moved the key"
    model = Scaled()
    if change == "attribute":
        model.scale = 3.0
    elif change == "shape":
        model.linear = nn.Linear(4, 4, bias=False)
    elif change == "dtype":
        model.half()
    elif change == "submodule":
        model.extra = nn.ReLU()
    elif change == "buffer":
        model.register_buffer("extra", torch.zeros(1))
    elif change == "call":
        call = [pieceworks.api.signature(a) for a in (torch.zeros(2, 4), torch.zeros(2, dtype=torch.int64))]
    else:
        config = CompilationConfig(splitting_ops=["silly::attention"], compile_sizes=[4])
    assert record.model_key(model, call, config) != key


SOURCE = '''
import torch
import torch.nn as nn


class Edited(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        torch.ops.silly.attention(x, x, x, out)
        return out * FACTOR
'''


def _import(path, name, monkeypatch):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # Dynamo looks the module up while it traces
    spec.loader.exec_module(module)
    return module


def test_an_edited_source_file_is_traced_again(tmp_path, caplog, monkeypatch):
    """The edit changes only the code: same class name, attributes and state, so only the traced files' digests
    can tell the record is stale."""
    path = tmp_path / "edited_model.py"
    x = torch.randn(3, 4)
    for factor, traces in ((2.0, 1), (2.0, 0), (5.0, 1)):
        path.write_text(SOURCE.replace("FACTOR", repr(factor)))
        model = _import(path, "edited_model", monkeypatch).Edited()
        caplog.clear()
        caplog.set_level("INFO", logger="pieceworks")
        with counters.expect(num_dynamo_traces=traces, num_traces_reused=1 - traces):
            torch.testing.assert_close(_compile(model, tmp_path / "cache")(x), 3 * x * factor)
    assert f"{path} changed since" in caplog.text
