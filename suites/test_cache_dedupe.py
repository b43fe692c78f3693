"""Dedupe soundness: pieces that differ only in a constant never share compiled code or a cache entry.

Structurally identical pieces (a transformer's middle layers) are compiled once and share the artifact; that
is sound only if everything that makes code differ enters the piece fingerprint. Here every piece has the same
shape (one op with a constant, then `silly::attention`) and only the constant varies: `x * 2` vs `x * 3`,
`x + 1` vs `x + 2`, `w[0]` vs `w[1]`. If `x*2 → attn → x*3 → attn` shared one piece, it would return 36
instead of 54 for ones.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn as nn
from hypothesis import given
from hypothesis import strategies as st

import pieceworks
from pieceworks import CompilationConfig, CUDAGraphMode, counters
from pieceworks.cache import parse_index

HIDDEN = 4
SPLIT = ["silly::attention"]

segments = st.lists(
    st.one_of(
        st.tuples(st.just("mul"), st.sampled_from([2.0, 3.0, 0.5])),
        st.tuples(st.just("add"), st.sampled_from([1, 2])),
        st.tuples(st.just("row"), st.integers(0, 2)),
    ),
    min_size=2,
    max_size=6,
).map(tuple)


class ConstantsModel(nn.Module):
    """For each segment `(kind, c)`: `x * c`, `x + c` or `x + w[c]`, then attention (`3x`). One piece each."""

    def __init__(self, segments: tuple) -> None:
        super().__init__()
        self.segments = segments
        gen = torch.Generator().manual_seed(0)
        self.w = nn.Parameter(torch.randn(3, HIDDEN, generator=gen), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for kind, c in self.segments:
            if kind == "mul":
                x = x * c
            elif kind == "add":
                x = x + c
            else:
                x = x + self.w[c]
            out = torch.empty_like(x)
            torch.ops.silly.attention(x, x, x, out)
            x = out
        return x


def _compile(segs, **config):
    torch._dynamo.reset()
    model = ConstantsModel(segs)
    compiled = pieceworks.compile(
        model, CompilationConfig(splitting_ops=SPLIT, cudagraph_mode=CUDAGraphMode.NONE, **config)
    )
    return model, compiled


class _EveryPieceAgainstItsGraph(torch.fx.Interpreter):
    """Runs the stitching module; each compiled piece's output is compared with its own graph run eagerly."""

    def __init__(self, graph) -> None:
        super().__init__(graph.stitching_module)
        self.items = {p.submod_name: p for p in graph.pieces if not p.is_splitting_graph}
        self.checked = []

    def call_module(self, target, args, kwargs):
        out = super().call_module(target, args, kwargs)
        if target in self.items:
            gm = self.items[target].fx_graph
            expected = gm(*args)
            # outputs made by empty_like are buffers for attention to fill: their contents are not values
            output = next(n for n in gm.graph.nodes if n.op == "output").args[0]
            values = [i for i, n in enumerate(output) if n.target is not torch.empty_like]
            torch.testing.assert_close(
                [out[i] for i in values], [expected[i] for i in values], msg=lambda m: f"piece {target}: {m}"
            )
            self.checked.append(target)
        return out


def _graph_args(graph, model, x):
    """The stitching module's arguments for input `x`: Dynamo's placeholders are the batch size, x and the
    weight."""
    args = []
    for node in (n for n in graph.stitching_module.graph.nodes if n.op == "placeholder"):
        value = node.meta["example_value"]
        args.append(x.shape[0] if isinstance(value, torch.SymInt) else model.w if "_w" in node.name else x)
    return args


def _fingerprints(graph):
    """Each compiled piece's fingerprint, what the compiler shares code by (taken at its analysis, over
    every value its trace held)."""
    return {piece.submod_name: piece.fingerprint for piece in graph.pieces if not piece.is_splitting_graph}


@given(segs=segments, batch=st.integers(1, 9))
def test_pieces_differing_in_a_constant_never_share_code(segs, batch):
    model, compiled = _compile(segs, compiler="eager")
    x = torch.randn(batch, HIDDEN, generator=torch.Generator().manual_seed(batch))
    torch.testing.assert_close(compiled(x), model(x))
    graph = compiled.runtime.compiled  # what the backend built: the stitching module and the pieces
    checker = _EveryPieceAgainstItsGraph(graph)
    checker.run(*_graph_args(graph, model, x))
    assert len(checker.checked) == len(segs)
    prints = _fingerprints(graph)
    names = [p.submod_name for p in graph.pieces if not p.is_splitting_graph]
    for i, a in enumerate(names):
        for j, b in enumerate(names[:i]):
            if prints[a] == prints[b]:
                assert segs[i] == segs[j], f"pieces {b} {segs[j]} and {a} {segs[i]} got one fingerprint"


@pytest.mark.inductor
def test_x_times_2_and_x_times_3_get_their_own_inductor_code_and_cache_entries(tmp_path):
    segs = (("mul", 2.0), ("mul", 3.0), ("mul", 2.0))
    with counters.expect(num_inductor_compiles=2, num_shared_piece_compiles=1, num_backend_compilations=3):
        model, compiled = _compile(segs, cache_dir=str(tmp_path))
        out = compiled(torch.ones(3, HIDDEN))
    assert torch.equal(
        out, torch.full((3, HIDDEN), 2.0 * 3 * 3 * 3 * 2 * 3)
    )  # not 2*3*2*3*2*3 (36 at two pieces)
    (key,) = [d for d in os.listdir(tmp_path) if d != "inductor" and not d.startswith("model-")]
    index = parse_index(open(os.path.join(tmp_path, key, "index.json"), "rb").read())
    assert len(index) == 2 and len({e["sha256"] for e in index.values()}) == 2
