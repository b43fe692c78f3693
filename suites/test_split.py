"""split_graph: piece counts, semantics, order, multi-output splitting ops, size decomposition."""

from __future__ import annotations

import operator

import pytest
import torch
import torch.nn as nn

from pieceworks import split_graph
from pieceworks.harness.models import toy as models
from suites.helpers import dynamo_graph

ATTN = ["silly::attention"]


def _outputs_equal(a, b):
    a = a if isinstance(a, (tuple, list)) else (a,)
    b = b if isinstance(b, (tuple, list)) else (b,)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        torch.testing.assert_close(x, y, rtol=0, atol=0)


def test_silly_model_has_5_pieces_3_compiled():
    gm, inputs = dynamo_graph(models.SillyModel(), [torch.randn(6)])
    split_gm, items = split_graph(gm, ATTN)
    assert len(items) == 5
    assert [i.is_splitting_graph for i in items] == [False, True, False, True, False]
    assert [i.graph_id for i in items] == list(range(5))
    assert all(getattr(split_gm, i.submod_name) is i.fx_graph for i in items)


@pytest.mark.parametrize("layers", [1, 2, 5])
def test_toy_llama_has_2l_plus_1_pieces(layers):
    model = models.ToyLlama(models.ToyLlamaConfig(num_layers=layers))
    gm, inputs = dynamo_graph(model, models.toy_llama_inputs(5))
    expected = gm(*inputs)
    split_gm, items = split_graph(gm, ATTN)
    assert len(items) == 2 * layers + 1
    assert sum(not i.is_splitting_graph for i in items) == layers + 1
    _outputs_equal(split_gm(*inputs), expected)


def test_overload_name_matches_like_packet_name():
    gm, _ = dynamo_graph(models.SillyModel(), [torch.randn(4)])
    _, by_overload = split_graph(gm, ["silly::attention.default"])
    assert len(by_overload) == 5
    gm, _ = dynamo_graph(models.SillyModel(), [torch.randn(4)])
    _, other_overload = split_graph(gm, ["silly::attention.out"])
    assert len(other_overload) == 1


def test_no_splitting_ops_gives_one_piece():
    gm, inputs = dynamo_graph(models.SillyModel(), [torch.randn(4)])
    expected = gm(*inputs)
    split_gm, items = split_graph(gm, [])
    assert len(items) == 1 and not items[0].is_splitting_graph
    _outputs_equal(split_gm(*inputs), expected)


class Consecutive(nn.Module):
    def forward(self, x):
        x = x * 2
        a = torch.empty_like(x)
        torch.ops.silly.attention(x, x, x, a)
        b = torch.empty_like(x)
        torch.ops.silly.attention(a, a, a, b)
        return b + 1


def test_consecutive_splitting_ops_share_a_piece():
    gm, inputs = dynamo_graph(Consecutive(), [torch.randn(3)])
    expected = gm(*inputs)
    split_gm, items = split_graph(gm, ATTN)
    # x*2, empty_like | attn | empty_like | attn | +1 : the empty_like between them breaks the run
    splitting = [i for i in items if i.is_splitting_graph]
    assert len(items) == 2 * len(splitting) + 1
    _outputs_equal(split_gm(*inputs), expected)


class BackToBack(nn.Module):
    def forward(self, x):
        a, b = torch.ops.silly.pair(x)
        c, d = torch.ops.silly.pair(a)
        return b * 3 + c - d


def test_adjacent_splitting_ops_share_one_piece_and_getitems_follow():
    gm, inputs = dynamo_graph(BackToBack(), [torch.randn(3)])
    expected = gm(*inputs)
    split_gm, items = split_graph(gm, ["silly::pair"])
    assert [i.is_splitting_graph for i in items] == [True, False]
    splitting = items[0].fx_graph
    getitems = [n for n in splitting.graph.nodes if n.target is operator.getitem]
    assert len(getitems) >= 3  # the unpacking of both pairs stays with the ops
    _outputs_equal(split_gm(*inputs), expected)


class MultiOutputInTheMiddle(nn.Module):
    def forward(self, x):
        y = x.sin()
        a, b = torch.ops.silly.pair(y)
        return a * b + y


def test_multi_output_splitting_op_makes_no_cycle():
    gm, inputs = dynamo_graph(MultiOutputInTheMiddle(), [torch.randn(7)])
    expected = gm(*inputs)
    split_gm, items = split_graph(gm, ["silly::pair"])
    assert [i.is_splitting_graph for i in items] == [False, True, False]
    _outputs_equal(split_gm(*inputs), expected)


class MutatesInput(nn.Module):
    """The read of x before `add_` must stay before it: only node order says so."""

    def forward(self, x, y):
        before = x * 2
        out = torch.empty_like(x)
        torch.ops.silly.attention(x, x, x, out)
        x.add_(1)
        y.mul_(out)
        return before + x, y


def test_order_is_kept_for_input_mutations():
    x, y = torch.randn(5), torch.randn(5)
    gm, inputs = dynamo_graph(MutatesInput(), [x, y])
    fresh = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    expected = gm(*fresh)
    split_gm, _ = split_graph(gm, ATTN)
    again = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
    _outputs_equal(split_gm(*again), expected)
    for a, b in zip(again, fresh):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, b, rtol=0, atol=0)  # the mutations happened identically


class UsesSizeAcrossPieces(nn.Module):
    def forward(self, x):
        shape = x.size()
        flat = x.reshape(-1)
        out = torch.empty_like(flat)
        torch.ops.silly.attention(flat, flat, flat, out)
        return out.view(shape) * 2


def test_sizes_are_decomposed_before_splitting():
    gm, inputs = dynamo_graph(UsesSizeAcrossPieces(), [torch.randn(4, 3)])
    expected = gm(*inputs)
    split_gm, items = split_graph(gm, ATTN)
    assert len(items) == 3
    for item in items:
        for node in item.fx_graph.graph.nodes:
            value = node.meta.get("example_value")
            assert not isinstance(value, torch.Size), f"a torch.Size crosses into {item.submod_name}"
    assert not any(n.op == "call_method" and n.target == "size" and len(n.args) == 1 for n in gm.graph.nodes)
    _outputs_equal(split_gm(*inputs), expected)
