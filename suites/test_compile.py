"""pieceworks.compile end to end on CPU: counters, no recompiles, dispatch, shared pieces, errors,
backends."""

from __future__ import annotations

import pytest
import torch

import pieceworks
from pieceworks import CompilationConfig, CUDAGraphMode, counters
from pieceworks.harness.models import toy as models


def eager_config(**kwargs):
    return CompilationConfig(splitting_ops=models.SPLITTING_OPS, compiler="eager", **kwargs)


def test_silly_model_counters_and_closed_form():
    compiled = pieceworks.compile(models.SillyModel(), eager_config())
    with counters.expect(
        num_graphs_seen=1,
        num_piecewise_graphs_seen=5,
        num_piecewise_capturable_graphs_seen=3,
        num_backend_compilations=3,
        num_eager_compiles=3,
        num_inductor_compiles=0,
        num_models_seen=0,
        num_cudagraph_captured=0,
    ):
        out = compiled(torch.zeros(8))
    assert torch.equal(out, torch.full((8,), 19.0))


@pytest.mark.parametrize("first_batch", [1, 2, 33])
def test_no_batch_size_retraces_or_recompiles(first_batch):
    compiled = pieceworks.compile(models.SillyModel(), eager_config())
    compiled(torch.randn(first_batch))
    with counters.expect(num_graphs_seen=0, num_backend_compilations=0, num_dynamo_traces=0):
        for batch in [1, 2, 3, 1, 17, 64, 255, 1, 8192]:
            x = torch.randn(batch)
            torch.testing.assert_close(compiled(x), models.silly_model_expected(x))


def test_toy_llama_pieces_and_identical_layers_compile_once():
    layers = 12
    model = models.ToyLlama(models.ToyLlamaConfig(num_layers=layers))
    compiled = pieceworks.compile(model, eager_config(compile_ranges=[16]))
    ids, pos = models.toy_llama_inputs(9)
    # first piece, 11 identical middle pieces, last piece: 3 distinct, each for 2 ranges
    with counters.expect(
        num_piecewise_graphs_seen=2 * layers + 1,
        num_piecewise_capturable_graphs_seen=layers + 1,
        num_eager_compiles=3 * 2,
        num_shared_piece_compiles=(layers + 1 - 3) * 2,
    ):
        out = compiled(ids, pos)
    torch.testing.assert_close(out, model(ids, pos))
    middle = [p for p in compiled.runtime.compiled.pieces if not p.is_splitting_graph][1:-1]
    assert all(p.runnables[(1, 16)] is middle[0].runnables[(1, 16)] for p in middle)


def test_tractable_toy_llama_matches_closed_form():
    compiled = pieceworks.compile(models.tractable_toy_llama(), eager_config())
    for batch in [1, 5, 300]:
        ids, pos = models.toy_llama_inputs(batch, seed=batch)
        torch.testing.assert_close(
            compiled(ids, pos).double(), models.tractable_expected(pos), rtol=1e-6, atol=0
        )


def test_dispatch_exact_size_then_range():
    config = eager_config(compile_ranges=[8, 64], compile_sizes=[4, 16], max_num_batched_tokens=256)
    compiled = pieceworks.compile(models.SillyModel(), config)
    with counters.expect(num_eager_compiles=3 * (3 + 2)):
        compiled(torch.randn(3))
    for piece in (p for p in compiled.runtime.compiled.pieces if not p.is_splitting_graph):
        expected = {
            1: (1, 8),
            4: 4,
            5: (1, 8),
            8: (1, 8),
            9: (9, 64),
            16: 16,
            17: (9, 64),
            65: (65, 256),
            256: (65, 256),
        }
        for batch, target in expected.items():
            assert piece.runnable(batch) is piece.runnables[target], (batch, target)
    x = torch.randn(16)
    torch.testing.assert_close(compiled(x), models.silly_model_expected(x))
    with pytest.raises(pieceworks.BatchSizeError, match=r"batch size 257 .*\(65, 256\)"):
        compiled(torch.randn(257))


def test_input_errors_are_clear():
    compiled = pieceworks.compile(models.SillyModel(), eager_config())
    with pytest.raises(pieceworks.InputError, match="0-d tensor"):
        compiled(torch.tensor(1.0))
    compiled(torch.randn(4))
    with pytest.raises(pieceworks.InputError, match="dtype=torch.float32"):
        compiled(torch.randn(4, dtype=torch.float64))
    with pytest.raises(
        pieceworks.InputError,
        match="compiled for 1 arguments, called with 2 arguments: too many positional arguments",
    ):
        compiled(torch.randn(4), torch.randn(4))
    model = models.ToyLlama(models.ToyLlamaConfig(num_layers=1))
    llama = pieceworks.compile(model, eager_config())
    ids, pos = models.toy_llama_inputs(4)
    with pytest.raises(pieceworks.InputError, match="disagree on the batch size"):
        llama(ids, pos[:3])


def test_two_models_of_one_class_keep_their_own_compiled_code():
    a = pieceworks.compile(models.SillyModel(), eager_config())
    b = pieceworks.compile(models.SillyModel(), CompilationConfig(splitting_ops=[], compiler="eager"))
    a(torch.randn(4))
    b(torch.randn(4))
    assert len(a.runtime.compiled.pieces) == 5 and len(b.runtime.compiled.pieces) == 1
    x = torch.randn(6)
    torch.testing.assert_close(b(x), models.silly_model_expected(x))


def test_registered_backend_and_backend_object():
    model = models.SillyModel()
    with counters.expect(num_piecewise_graphs_seen=5):
        fn = torch.compile(
            model,
            backend="pieceworks",
            fullgraph=True,
            options={"splitting_ops": ["silly::attention"], "compiler": "eager"},
        )
        x = torch.randn(4)
        torch.testing.assert_close(fn(x), models.silly_model_expected(x))
    torch._dynamo.reset()
    backend = pieceworks.Backend(eager_config(cudagraph_mode=CUDAGraphMode.NONE))
    fn = torch.compile(model, backend=backend, fullgraph=True)
    fn(torch.randn(4))
    assert len(backend.runtimes) == 1 and len(backend.runtimes[0].compiled.pieces) == 5


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_torch_compiles_mode_is_refused_by_name_naming_the_options_that_set_cuda_graphs(mode):
    """`mode` selects Inductor's presets (its own CUDA graphs, autotuning), which pieceworks does not read."""
    torch._dynamo.reset()
    fn = torch.compile(models.SillyModel(), backend="pieceworks", fullgraph=True, mode=mode)
    with pytest.raises(Exception, match=rf"mode='{mode}'.*Fix: leave mode out.*cudagraph_mode"):
        fn(torch.randn(4))
    torch._dynamo.reset()


@pytest.mark.parametrize("recipe", [True, False])
def test_torch_compile_traces_once_for_every_batch_size_with_the_recipe(recipe):
    """docs/your-model.md's recipe for `torch.compile(model, backend="pieceworks")`: dim 0 of the first call's
    tensors marked dynamic and torch's 0/1 size specialisation off while it traces (`backed_size_oblivious`):
    one Dynamo graph serves batches 1, 2, 7 and 100, each piece compiled once. Without it, a first call of
    batch 1 bakes that size in, and batch 2 traces and compiles a second, dynamic graph."""
    torch.manual_seed(0)
    model = models.ToyLlama(models.ToyLlamaConfig(num_layers=2))
    fn = torch.compile(
        model,
        backend="pieceworks",
        fullgraph=True,
        options={"splitting_ops": models.SPLITTING_OPS, "compiler": "eager", "cudagraph_mode": "NONE"},
    )
    graphs, compiles = (1, 3) if recipe else (2, 6)  # 3 distinct pieces, one compile range
    with counters.expect(num_graphs_seen=graphs, num_eager_compiles=compiles):
        for batch in (1, 2, 7, 100):
            args = models.toy_llama_inputs(batch)
            if batch == 1 and recipe:
                for a in args:
                    torch._dynamo.mark_dynamic(a, 0)
                with torch.fx.experimental._config.patch(backed_size_oblivious=True):
                    out = fn(*args)
            else:
                out = fn(*args)
            torch.testing.assert_close(out, model(*args))


def test_the_runtime_says_where_its_build_took_its_time():
    import time

    model = models.ToyLlama(models.ToyLlamaConfig(num_layers=2))
    compiled = pieceworks.compile(model, eager_config())
    start = time.perf_counter()
    compiled(*models.toy_llama_inputs(3))
    first_call = time.perf_counter() - start
    seconds = compiled.runtime.compiled.build_seconds
    assert set(seconds) == {"split", "pieces", "load", "compile", "backend"}
    assert 0 < seconds["split"] and 0 < seconds["pieces"] and seconds["load"] == 0  # eager: no cache
    assert seconds["load"] + seconds["compile"] <= seconds["pieces"]
    assert seconds["split"] + seconds["pieces"] <= seconds["backend"] < first_call


def test_compile_logs_each_phase(caplog):
    caplog.set_level("INFO", logger="pieceworks")
    pieceworks.compile(models.SillyModel(), eager_config())(torch.randn(3))
    text = caplog.text
    assert "pieceworks split: 5 pieces, 3 compiled" in text
    assert "pieceworks compile (eager)" in text
    assert "traced and compiled in" in text


def test_after_the_first_call_no_call_enters_dynamo():
    """The compiled graph is called directly: a Dynamo reset (which drops every compiled frame) changes
    nothing."""
    compiled = pieceworks.compile(models.SillyModel(), eager_config())
    compiled(torch.randn(4))
    assert compiled.binder is not None
    torch._dynamo.reset()
    with counters.expect(num_dynamo_traces=0, num_graphs_seen=0, num_backend_compilations=0):
        for batch in [1, 4, 9]:
            x = torch.randn(batch)
            torch.testing.assert_close(compiled(x), models.silly_model_expected(x))


class ReturnsItsInput(torch.nn.Module):
    def forward(self, x):
        return x * 2, x  # `x` is returned by Dynamo's bytecode, not by the graph: no provable binding


def test_unprovable_binding_calls_through_dynamo_and_a_retrace_is_refused(caplog):
    caplog.set_level("INFO", logger="pieceworks")
    compiled = pieceworks.compile(ReturnsItsInput(), eager_config())
    compiled(torch.randn(4))
    assert compiled.binder is None
    (warning,) = [
        r.getMessage()
        for r in caplog.records  # once, with why and the fix
        if r.levelname == "WARNING" and "Dynamo" in r.getMessage()
    ]
    assert "every call of this model goes through Dynamo" in warning
    assert (
        "the model's output holds values that are not graph outputs (Tensor). Fix: return tensors" in warning
    )
    x = torch.randn(3)
    doubled, same = compiled(x)
    assert same is x and torch.equal(doubled, x * 2)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="Dynamo asked to compile this model again"):
        compiled(torch.randn(1))


def test_pieces_with_different_constants_never_share_compiled_code():
    from pieceworks.key import graph_fingerprint

    class AddsConstant(torch.nn.Module):
        def __init__(self, value):
            super().__init__()
            self.constant = torch.tensor([value])  # a plain attribute: a get_attr node in the graph

        def forward(self, x):
            return x + self.constant

    def fingerprint(value):
        return graph_fingerprint(torch.fx.symbolic_trace(AddsConstant(value)))

    assert fingerprint(1.0) == fingerprint(1.0)
    assert fingerprint(1.0) != fingerprint(2.0)


SCALE = 1.0  # a module global the model below reads on both sides of its splitting op


class ScaledAttention(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        y = x * SCALE
        torch.ops.silly.attention(y, y, y, out)
        return out * SCALE + 1


def test_torch_compile_recompiling_for_a_changed_python_float_serves_it(monkeypatch):
    """Dynamo recompiles a graph for a module-level float it saw change, passing it as a 0-d tensor read with
    `.item()`; that scalar is read on both sides of the splitting op, so no piece may hand it to the next
    (Inductor compiles no piece that returns a SymFloat): each piece reads it again."""
    torch._dynamo.reset()
    options = {"splitting_ops": models.SPLITTING_OPS, "cudagraph_mode": "NONE"}
    fn = torch.compile(ScaledAttention(), backend="pieceworks", fullgraph=True, options=options)
    x = torch.randn(4, 8)
    for scale in (1.0, 2.0, 3.0):
        monkeypatch.setitem(globals(), "SCALE", scale)
        torch.testing.assert_close(fn(x), ScaledAttention()(x))
    torch._dynamo.reset()


def test_a_compiled_model_called_inside_torch_compile_is_served_outside_its_trace():
    """`torch.compile` of a function that calls a CompiledModel (or of the CompiledModel itself): the caller's
    trace breaks at the call, which is served as any other, without a trace of the model."""
    model = models.SillyModel()
    config = CompilationConfig(splitting_ops=["silly::attention"], compiler="eager", cudagraph_mode="NONE")
    compiled, x = pieceworks.compile(model, config), torch.randn(4, 8)
    compiled(x)
    with counters.expect(num_dynamo_traces=0):
        torch.testing.assert_close(torch.compile(lambda t: compiled(t) * 2, backend="eager")(x), model(x) * 2)
        torch.testing.assert_close(torch.compile(compiled, backend="eager")(x), model(x))
