"""The runtime on CPU: replay plans (with a simulated graph), address checks, and calls without Dynamo.

A CUDA graph reads the input tensors it captured and writes the output tensors it captured. `SimulatedGraph`
does exactly that on CPU (it re-runs the piece on the captured input objects and copies the results into the
captured outputs), so the plan's bookkeeping (which values are constants, which are fresh per call, what is
checked or copied) is tested here; the real graphs are tested in test_cudagraph_gpu.py.
"""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
import torch.nn as nn

import pieceworks
from pieceworks import CompilationConfig, counters
from pieceworks.cudagraph import ReplayAddressError
from pieceworks.harness.models import toy as models
from pieceworks.plan import record_plan
from pieceworks.values import tensors_in


class SimulatedGraph:
    def __init__(self, fn, args):
        self.fn, self.args = fn, args
        self.outputs = fn(*args)

    def replay(self):
        for captured, fresh in zip(tensors_in(self.outputs), tensors_in(self.fn(*self.args))):
            captured.copy_(fresh)


def simulated_capture(fn, args, mutated, batch):
    graph = SimulatedGraph(fn, list(args))
    return graph, graph.outputs


def _plan_of(model, make_inputs, batch, splitting_ops=models.SPLITTING_OPS):
    """A compiled model (eager compiler), and a plan recorded at `batch` on static buffers, every piece
    captured."""
    compiled = pieceworks.compile(model, CompilationConfig(splitting_ops=splitting_ops, compiler="eager"))
    compiled(*make_inputs(3))
    graph = compiled.runtime.compiled
    pieces = {p.submod_name: p for p in graph.pieces if not p.is_splitting_graph}
    static = [
        a.clone() if isinstance(a, torch.Tensor) and not isinstance(a, nn.Parameter) else a
        for a in compiled.binder.inputs(make_inputs(batch), batch)
    ]
    plan, _ = record_plan(graph.stitching_module, batch, static, pieces, simulated_capture)
    return plan, static, compiled


class FreshSplitOutputs(nn.Module):
    """silly::pair returns freshly allocated tensors, which the next (captured) piece reads."""

    def forward(self, x):
        a, b = torch.ops.silly.pair(x * 3)
        return a * b + 1


@pytest.mark.parametrize("name", ["silly", "toy_llama", "fresh_split_outputs"])
def test_plan_replays_equal_eager_for_new_values_in_the_static_buffers(name):
    torch.manual_seed(0)
    if name == "toy_llama":
        config = models.ToyLlamaConfig(num_layers=2)
        model = models.ToyLlama(config)
        make_inputs = lambda b, seed=0: models.toy_llama_inputs(b, config, seed=seed)  # noqa: E731 - one of two input makers picked by case
    else:
        model = models.SillyModel() if name == "silly" else FreshSplitOutputs()
        make_inputs = lambda b, seed=0: (torch.randn(b, generator=torch.Generator().manual_seed(seed)),)  # noqa: E731 - one of two input makers picked by case
    ops = ["silly::pair"] if name == "fresh_split_outputs" else models.SPLITTING_OPS
    plan, static, compiled = _plan_of(model, make_inputs, 8, ops)
    if name == "fresh_split_outputs":
        assert plan.kept, "the captured piece reads silly::pair's fresh outputs: the plan must own them"
    graph_steps = [step for step in plan.steps if step.how == "cuda_graph"]
    assert (
        len(graph_steps)
        == len(plan.cuda_graphs)
        == sum(not p.is_splitting_graph for p in compiled.runtime.compiled.pieces)
    )
    for seed in [1, 2, 3]:
        args = make_inputs(8, seed)
        fresh = compiled.binder.inputs(args, 8)
        for buffer, value in zip(static, fresh):
            if isinstance(buffer, torch.Tensor) and buffer.shape[:1] == (8,):
                buffer.copy_(value)
        out = compiled.binder.outputs(plan.run(static, ()))
        torch.testing.assert_close(out, model(*args))


def test_plan_checks_caller_inputs_that_moved_but_not_parameters():
    torch.manual_seed(0)
    config = models.ToyLlamaConfig(num_layers=1)
    model = models.ToyLlama(config)
    plan, static, _ = _plan_of(model, lambda b: models.toy_llama_inputs(b, config), 4)
    cheap = {i for i, *_ in plan.cheap_checks}
    every = {i for i, *_ in plan.all_checks}
    kinds = [isinstance(a, torch.nn.Parameter) for a in static]
    assert cheap and all(not kinds[i] for i in cheap)  # caller inputs only
    assert every - cheap and all(kinds[i] for i in every - cheap)  # debug mode adds the parameters
    plan.run(static, plan.cheap_checks)  # in place: fine
    moved = list(static)
    i = next(iter(cheap))
    moved[i] = static[i].clone()
    with pytest.raises(
        ReplayAddressError, match=r"piece submod_\d+ \(graph \d+\): input \d+ \(\w+\) is at .* batch size 4"
    ):
        plan.run(moved, plan.cheap_checks)


def test_parameter_data_swaps_are_seen_by_direct_calls():
    torch.manual_seed(0)
    config = models.ToyLlamaConfig(num_layers=1)
    model = models.ToyLlama(config)
    compiled = pieceworks.compile(
        model, CompilationConfig(splitting_ops=models.SPLITTING_OPS, compiler="eager")
    )
    ids, pos = models.toy_llama_inputs(5, config)
    compiled(ids, pos)
    assert compiled.binder is not None
    weight = model.layers[0].mlp.down_proj.weight
    weight.data = torch.randn_like(weight) * 10
    torch.testing.assert_close(compiled(ids, pos), model(ids, pos))
    with torch.no_grad():
        weight.mul_(-1)  # and in-place updates
    torch.testing.assert_close(compiled(ids, pos), model(ids, pos))


class UsesTheBatchSize(nn.Module):
    def forward(self, x):
        rows = torch.arange(x.shape[0], dtype=x.dtype)  # the batch size enters the graph as a SymInt input
        return x * 2 + rows.view(x.shape[0], 1)


def test_symbolic_batch_inputs_get_each_calls_batch_size():
    model = UsesTheBatchSize()
    compiled = pieceworks.compile(model, CompilationConfig(compiler="eager"))
    compiled(torch.randn(4, 3))
    assert compiled.binder is not None
    with counters.expect(num_dynamo_traces=0):
        for batch in [1, 2, 7, 4]:
            x = torch.randn(batch, 3)
            torch.testing.assert_close(compiled(x), model(x))


class ReturnsAStructure(nn.Module):
    def forward(self, x, y):
        a = x + 1
        return {"sum": a + y, "pair": (a * 2, None), "list": [y - 1, a]}


def test_direct_calls_return_the_models_output_structure():
    model = ReturnsAStructure()
    compiled = pieceworks.compile(model, CompilationConfig(compiler="eager"))
    compiled(torch.randn(3, 2), torch.randn(3, 2))
    assert compiled.binder is not None
    x, y = torch.randn(5, 2), torch.randn(5, 2)
    got, want = compiled(x, y), model(x, y)
    assert type(got) is dict and list(got) == list(want)
    assert type(got["pair"]) is tuple and got["pair"][1] is None and type(got["list"]) is list
    torch.testing.assert_close(got, want)


def test_a_dropped_compiled_model_is_freed_with_its_runtime_and_pieces():
    """Nothing process-wide (Dynamo's table of backends, its compiled functions) keeps a CompiledModel that
    its caller dropped alive, nor its runtime and pieces; the caller's model lives on."""
    config = models.ToyLlamaConfig(num_layers=2)
    model = models.ToyLlama(config)  # the caller keeps its model
    compiled = pieceworks.compile(
        model, CompilationConfig(splitting_ops=models.SPLITTING_OPS, compiler="eager")
    )
    with torch.no_grad():
        compiled(*models.toy_llama_inputs(3, config))
    held = [weakref.ref(x) for x in (compiled, compiled.runtime, *compiled.runtime.compiled.pieces)]
    del compiled
    gc.collect()
    assert [ref() for ref in held] == [None] * len(held)


def test_the_pool_estimate_needs_the_first_call_and_is_zero_without_graphs():
    compiled = pieceworks.compile(
        models.SillyModel(),
        CompilationConfig(splitting_ops=models.SPLITTING_OPS, compiler="eager", cudagraph_mode="NONE"),
    )
    with pytest.raises(RuntimeError, match="call the model once before estimate_capture"):
        compiled.estimate_capture()
    compiled(torch.randn(4))
    report = compiled.estimate_capture()
    assert report["pool_bytes"] == 0 and report["sampled_sizes"] == []
