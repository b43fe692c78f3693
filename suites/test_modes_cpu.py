"""CUDA-graph modes on a machine without CUDA, and the graph analyses behind capture, all on CPU."""

from __future__ import annotations

import dataclasses
import operator

import pytest
import torch
import torch.nn as nn

import pieceworks
from pieceworks import CompilationConfig, CUDAGraphMode, counters
from pieceworks.batch_kind import graph_support, supported_mode
from pieceworks.harness.models import llama
from pieceworks.harness.models import toy as models
from pieceworks.harness.testing.checked import CheckedModel, OutputOverwrittenError
from pieceworks.padding import StaticInputs, unpad
from pieceworks.piece import moving_inputs, mutated_inputs, uncapturable_reason
from pieceworks.split import split_graph
from suites.helpers import dynamo_graph


def test_modes_are_lowered_to_what_the_splitting_ops_support():
    M, S = CUDAGraphMode, pieceworks.GraphSupport
    lowered = {(m, s): supported_mode(m, s) for m in M for s in S}
    assert all(lowered[m, S.ALWAYS] is m for m in M)  # nothing to lower
    assert {m: lowered[m, S.UNIFORM_DECODE] for m in M} == {  # vLLM: FULL -> FULL_AND_PIECEWISE
        M.NONE: M.NONE,
        M.PIECEWISE: M.PIECEWISE,
        M.FULL: M.FULL_AND_PIECEWISE,
        M.FULL_DECODE_ONLY: M.FULL_DECODE_ONLY,
        M.FULL_AND_PIECEWISE: M.FULL_AND_PIECEWISE,
    }
    assert {m: lowered[m, S.NEVER] for m in M} == {  # no full graph around the op, for any batch
        M.NONE: M.NONE,
        M.PIECEWISE: M.PIECEWISE,
        M.FULL: M.PIECEWISE,
        M.FULL_DECODE_ONLY: M.NONE,
        M.FULL_AND_PIECEWISE: M.PIECEWISE,
    }
    for m in M:  # a lowered mode never puts a full graph where the support forbids one
        assert (
            lowered[m, S.NEVER].decode_mode is not M.FULL
            and lowered[m, S.UNIFORM_DECODE].mixed_mode is not M.FULL
        )


def test_graph_support_is_the_least_declared_and_uniform_decode_is_scoped():
    pieceworks.declare_graph_support("pwtest::planned", "uniform_decode")
    pieceworks.declare_graph_support("pwtest::host", pieceworks.GraphSupport.NEVER)
    assert graph_support({"pwtest::planned", "silly::attention"}) == (
        pieceworks.GraphSupport.UNIFORM_DECODE,
        "pwtest::planned",
    )
    assert graph_support({"pwtest::planned", "pwtest::host"})[0] is pieceworks.GraphSupport.NEVER
    assert graph_support({"silly::attention"}) == (pieceworks.GraphSupport.ALWAYS, None)  # undeclared: ALWAYS
    for bad in [("pwtest::x.default", "never"), ("pwtest", "never"), ("pwtest::x", "sometimes")]:
        with pytest.raises(ValueError, match="expected an op packet name"):
            pieceworks.declare_graph_support(*bad)
    assert not pieceworks.is_uniform_decode()  # outside: mixed, the kind every mode serves right
    with pieceworks.uniform_decode():
        assert pieceworks.is_uniform_decode()
        with pieceworks.uniform_decode(False):
            assert not pieceworks.is_uniform_decode()
        assert pieceworks.is_uniform_decode()
    assert not pieceworks.is_uniform_decode()


@pytest.mark.parametrize("mode", list(CUDAGraphMode))
def test_every_mode_runs_without_graphs_on_cpu_and_says_so(mode, caplog):
    caplog.set_level("INFO", logger="pieceworks")
    config = CompilationConfig(
        splitting_ops=models.SPLITTING_OPS,
        compiler="eager",
        cudagraph_mode=mode,
        cudagraph_capture_sizes=[1, 2, 4, 8],
    )
    compiled = pieceworks.compile(models.SillyModel(), config)
    with counters.expect(num_cudagraph_captured=0):
        for batch in [3, 1, 8, 20]:
            x = torch.randn(batch)
            torch.testing.assert_close(compiled(x), models.silly_model_expected(x))
        report = compiled.capture()
        x = torch.randn(5)
        torch.testing.assert_close(compiled(x), models.silly_model_expected(x))
    assert report["graphs"] == 0
    assert compiled.runtime.mode is CUDAGraphMode.NONE
    warned = [r for r in caplog.records if "running without CUDA graphs" in r.getMessage()]
    if mode is CUDAGraphMode.NONE:
        assert not warned
    else:  # a graph mode that silently became NONE is a WARNING, once, naming the way to silence it
        assert (
            len(warned) == 1
            and warned[0].levelname == "WARNING"
            and "cudagraph_mode=NONE" in warned[0].getMessage()
        )


def test_capture_before_first_call_is_an_error():
    compiled = pieceworks.compile(models.SillyModel(), CompilationConfig(compiler="eager"))
    with pytest.raises(RuntimeError, match="call the model once"):
        compiled.capture()


class MutatesSplitOutput(nn.Module):
    def forward(self, x):
        a, b = torch.ops.silly.pair(x * 2)
        a.add_(1)
        return a * b


def test_mutation_of_a_splitting_output_is_found_and_refused():
    gm, _ = dynamo_graph(MutatesSplitOutput(), [torch.randn(4)])
    split_gm, pieces = split_graph(gm, ["silly::pair"])
    last = pieces[-1]
    moving = moving_inputs(split_gm, last.submod_name, {pieces[1].submod_name})
    assert "split" in _sources(split_gm, last.submod_name, {pieces[1].submod_name})
    assert moving == _positions(split_gm, last.submod_name, {pieces[1].submod_name}, "split")
    assert set(last.moving_inputs) == moving
    assert mutated_inputs(last.fx_graph) & moving
    # the record says why PIECEWISE refuses it; on CPU the first objection is the CPU tensor itself
    assert last.piecewise_refusal is not None and last.piecewise_refusal == last.uncapturable
    with_cuda = dataclasses.replace(last, uncapturable=None)
    assert (
        "mutates input" in with_cuda.piecewise_refusal
        and "splitting op allocates anew" in with_cuda.piecewise_refusal
    )
    first = pieces[0]
    assert "CPU tensor" in uncapturable_reason(first.fx_graph, first.example_args)


def _sources(split_gm, submod_name, splitting_names) -> list[str]:
    """Where each argument of the call to `submod_name` in the stitching graph comes from, read off the FX
    graph: "param" (a parameter or buffer), "input" (a graph input the caller owns), "piece" (a compiled
    piece's output), "split" (a splitting piece's output or glue: may move), "constant"."""
    call = next(n for n in split_gm.graph.nodes if n.op == "call_module" and n.target == submod_name)
    kinds = []
    for node in call.args:
        while (
            isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is operator.getitem
        ):
            node = node.args[0]
        if not isinstance(node, torch.fx.Node):
            kinds.append("constant")
        elif node.op == "placeholder":
            value = node.meta.get("example_value", node.meta.get("val"))
            kinds.append("param" if isinstance(value, torch.nn.Parameter) else "input")
        elif node.op == "call_module":
            kinds.append("split" if node.target in splitting_names else "piece")
        else:
            kinds.append("split")
    return kinds


def _positions(split_gm, submod_name, splitting_names, kind) -> set[int]:
    return {i for i, k in enumerate(_sources(split_gm, submod_name, splitting_names)) if k == kind}


def test_input_provenance_of_toy_llama_pieces():
    model = models.ToyLlama(models.ToyLlamaConfig(num_layers=2))
    gm, _ = dynamo_graph(model, models.toy_llama_inputs(4))
    split_gm, pieces = split_graph(gm, ["silly::attention"])
    splitting = {p.submod_name for p in pieces if p.is_splitting_graph}
    assert (
        not pieces[0].is_splitting_graph and pieces[1].is_splitting_graph and not pieces[2].is_splitting_graph
    )
    first = _sources(split_gm, pieces[0].submod_name, splitting)
    assert "input" in first and "param" in first and "piece" not in first
    assert moving_inputs(split_gm, pieces[0].submod_name, splitting) == set() == set(pieces[0].moving_inputs)
    middle = _sources(split_gm, pieces[2].submod_name, splitting)
    assert "piece" in middle and "split" not in middle  # attention writes into a buffer the piece before made
    assert moving_inputs(split_gm, pieces[2].submod_name, splitting) == set() == set(pieces[2].moving_inputs)


def test_mutated_model_inputs_are_found():
    class AddsInPlace(nn.Module):
        def forward(self, x, y):
            x.add_(1)
            y[:, 0] += 2
            return x * 2

    gm, inputs = dynamo_graph(AddsInPlace(), [torch.randn(3), torch.randn(3, 2)])
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    assert {placeholders[i].target for i in mutated_inputs(gm)} == {"L_x_", "L_y_"}


def test_full_captures_put_back_what_compiled_pieces_write_not_what_splitting_ops_write():
    """FULL's warm-ups re-run the whole graph: inputs a compiled piece writes (a call counter) are put back
    after them, so a capture writes them once; those only a splitting op writes (attention's KV cache) are
    not, so a capture copies no cache (a copy of every layer's cache is 4.3 GB for the 1B Llama)."""

    class Counted(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.llama = llama.Llama(llama.TINY)
            self.register_buffer("calls", torch.zeros(1, dtype=torch.int64))

        def forward(self, ids, positions):
            self.calls.add_(1)
            return self.llama(ids, positions)

    model = Counted()
    compiled = pieceworks.compile(
        model, CompilationConfig(splitting_ops=llama.SPLITTING_OPS, compiler="eager")
    )
    with torch.no_grad():
        compiled(*llama.decode_batch(model.llama, 4))
    graph = compiled.runtime.compiled
    names = [n.target for n in graph.stitching_module.graph.nodes if n.op == "placeholder"]
    caches = {i for i, name in enumerate(names) if name.endswith(("k_cache_", "v_cache_"))}
    assert len(caches) == 2 * llama.TINY.num_layers and caches < set(graph.mutated_inputs)
    assert [names[i] for i in graph.restored_inputs] == [next(n for n in names if n.endswith("calls_"))]


def test_static_inputs_keep_addresses_and_pad_with_valid_rows():
    ids = torch.tensor([5, 6, 7])
    static = StaticInputs([ids, 3.0], max_size=8)
    assert static.buffers[0].tolist() == [5, 6, 7, 5, 6, 7, 5, 6]
    static.load([torch.tensor([1, 2]), 3.0], batch=2)
    view = static.views(4)
    assert view[0].tolist() == [1, 2, 7, 5] and view[1] == 3.0
    assert static.views(4)[0].data_ptr() == static.buffers[0].data_ptr()
    out = (torch.arange(4), torch.zeros(4, 2), torch.zeros(3))
    cut = unpad(out, 2, 4)
    assert cut[0].tolist() == [0, 1] and cut[1].shape == (2, 2) and cut[2].shape == (3,)


def test_checked_model_catches_a_kept_output_that_was_overwritten():
    buffer = torch.zeros(4)

    def model(x):  # returns views of one buffer, like graph replays do
        buffer.copy_(x)
        return buffer[:]

    checked = CheckedModel(model)
    checked(torch.ones(4)).clone()  # a clone is fine
    checked(torch.full((4,), 2.0))
    kept = checked(torch.full((4,), 3.0))
    with pytest.raises(OutputOverwrittenError, match="call #3"):
        checked(torch.full((4,), 4.0))
    del kept
