"""What a new user runs into: data-dependent sizes, misspelt or unused splitting ops, graph modes that cannot apply.

The data-dependent model has all three kinds of sizes a trace cannot know from the batch: a splitting op whose fake
impl makes a fresh size (`new_dynamic_size()`), `.item()` and `nonzero`. Its result is row-independent, so that
padding to a captured size (GPU tests) cannot change the real rows.
"""

from __future__ import annotations

import logging

import pytest
import torch
import torch.nn as nn

import pieceworks
from pieceworks import CompilationConfig, ConfigError, CUDAGraphMode, counters
from pieceworks.piece import data_dependent_sizes
from pieceworks.harness import models


@torch.library.custom_op("pwfaults::positive_rows", mutates_args=())
def positive_rows(x: torch.Tensor) -> torch.Tensor:
    """Indices of the positive entries of a 1-d tensor: a splitting op with a data-dependent output size."""
    return torch.nonzero(x > 0).flatten()


@positive_rows.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return x.new_empty((torch.library.get_ctx().new_dynamic_size(),), dtype=torch.long)


DATA_DEPENDENT_OPS = ["pwfaults::positive_rows", "silly::attention"]


class DataDependent(nn.Module):
    """5 pieces: [x*2+1] [positive_rows] [rows scaled by 3: input of data-dependent size] [attention]
    [.item() and nonzero: host syncs]."""

    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.tensor([0.5, -2.0, 1.5]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * 2 + 1
        rows = torch.ops.pwfaults.positive_rows(h[:, 0].contiguous())
        out = torch.zeros_like(h).index_copy(0, rows, h.index_select(0, rows) * 3)
        attended = torch.empty_like(out)
        torch.ops.silly.attention(out, out, out, attended)
        scale = self.w.abs().max().item()
        picked = torch.nonzero(attended[:, 1] > 0).flatten()
        return attended.index_add(0, picked, attended.new_ones(picked.shape[0], 4)) * scale


def _batches(device: str = "cpu", nonempty: bool = False) -> list[torch.Tensor]:
    """Several batch sizes, and one size several times with a different number of positive rows each time.

    `nonempty`: row 0 is positive, so no data-dependent size is 0. Inductor's Triton code in torch 2.11 divides by
    zero launching a 2-d pointwise kernel over a zero-size data-dependent dimension (seen on an H100, 2026-11-22:
    `ZeroDivisionError` in `triton_heuristics.run` for `index_add` over `nonzero`'s empty result): an upstream
    limit, not ours; the CPU tests keep the empty cases."""
    g = torch.Generator().manual_seed(0)
    sizes = [5, 4, 4, 4, 1, 9, 30, 4]
    batches = [torch.randn(b, 4, generator=g) for b in sizes]
    if nonempty:
        for x in batches:
            x[0] = x[0].abs() + 0.5
    return [x.to(device) for x in batches]


def _data_dependent_pieces(compiled) -> set[str]:
    pieces = compiled.runtime.graph.pieces
    found = {p.submod_name for p in pieces if not p.is_splitting_graph and data_dependent_sizes(p.graph)}
    assert found == {p.submod_name for p in pieces if not p.is_splitting_graph and p.unbacked_symbols}
    return found


def _check_data_dependent_model(compiler: str, compile_sizes: list[int]) -> pieceworks.CompiledModel:
    model = DataDependent()
    config = CompilationConfig(splitting_ops=DATA_DEPENDENT_OPS, compiler=compiler, compile_sizes=compile_sizes)
    compiled = pieceworks.compile(model, config)
    for x in _batches():
        torch.testing.assert_close(compiled(x), model(x))
    pieces = compiled.runtime.graph.pieces
    assert [p.is_splitting_graph for p in pieces] == [False, True, False, True, False]
    assert _data_dependent_pieces(compiled) == {pieces[2].submod_name, pieces[4].submod_name}
    return compiled


def test_data_dependent_sizes_split_compile_and_run_eager():
    """A splitting op with a fresh size splits without a cycle; its size crosses to the next piece as an argument.
    Compile sizes of a data-dependent piece are served by its range code: a static compile would bake in the sizes
    of the one call it was specialised with (with Inductor: a size assertion on the next call at that size)."""
    compiled = _check_data_dependent_model("eager", compile_sizes=[4])
    dependent = _data_dependent_pieces(compiled)
    for piece in compiled.runtime.graph.pieces:
        if not piece.is_splitting_graph:
            served_by_range = piece.runnables[4] is piece.runnables[(1, 8192)]
            assert served_by_range == (piece.submod_name in dependent), piece.submod_name


@pytest.mark.inductor
def test_data_dependent_sizes_compile_and_run_with_inductor():
    """No PendingUnbackedSymbolNotFound: piece arguments are read from the trace, not re-derived under fake mode."""
    _check_data_dependent_model("inductor", compile_sizes=[])


def test_the_size_a_splitting_op_binds_stays_in_its_piece():
    compiled = pieceworks.compile(DataDependent(), CompilationConfig(splitting_ops=DATA_DEPENDENT_OPS,
                                                                     compiler="eager"))
    compiled(torch.randn(6, 4))
    items = compiled.runtime.graph.pieces
    splitting = [n.target for n in items[1].graph.graph.nodes if n.op == "call_function"]
    assert torch.ops.aten.sym_size.int in splitting
    reader = [n for n in items[2].graph.graph.nodes if n.op == "placeholder"]
    assert any(isinstance(n.meta.get("example_value"), torch.SymInt) for n in reader)


def test_a_misspelt_splitting_op_is_a_config_error_naming_the_close_match():
    config = CompilationConfig(splitting_ops=["silly::atention"], compiler="eager")  # checked when compiled
    compiled = pieceworks.compile(models.SillyModel(), config)
    with pytest.raises(ConfigError, match=r"'silly::atention' names no registered op; namespace 'silly' has "
                                          r"\(closest first\) silly::attention, .*Fix: correct the name"):
        compiled(torch.randn(4))
    bad_overload = CompilationConfig(splitting_ops=["silly::attention.out"], compiler="eager")
    with pytest.raises(ConfigError, match=r"no overload 'out', only \['default'\]"):
        pieceworks.compile(models.SillyModel(), bad_overload)(torch.randn(4))
    torch._dynamo.reset()
    backend = pieceworks.Backend(CompilationConfig(splitting_ops=["sily::attention"], compiler="eager"))
    with pytest.raises(Exception, match=r"no op is registered in namespace 'sily' \(close namespaces: silly\)"):
        torch.compile(models.SillyModel(), backend=backend, fullgraph=True)(torch.randn(4))


def test_a_registered_splitting_op_the_graph_never_calls_gets_one_warning(caplog):
    caplog.set_level(logging.WARNING, logger="pieceworks")
    config = CompilationConfig(splitting_ops=["silly::attention", "silly::pair"], compiler="eager",
                               cudagraph_mode="NONE")
    compiled = pieceworks.compile(models.SillyModel(), config)
    for batch in [3, 1, 7]:
        compiled(torch.randn(batch))
    warned = [r for r in caplog.records if "never called" in r.getMessage()]
    assert len(warned) == 1 and "['silly::pair']" in warned[0].getMessage()
    caplog.clear()
    pieceworks.compile(models.SillyModel(), CompilationConfig(splitting_ops=["silly::attention"], compiler="eager",
                                                              cudagraph_mode="NONE"))(torch.randn(3))
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


# ---- on a GPU -------------------------------------------------------------------------------------------------
SIZES = [1, 2, 4, 8, 16]


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("mode", [CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL_AND_PIECEWISE])
def test_pieces_with_data_dependent_sizes_run_without_graphs_logged_once(mode, caplog, cuda):
    """Host syncs and inputs of data-dependent size are never captured: a graph would replay one call's sizes."""
    caplog.set_level(logging.INFO, logger="pieceworks")
    model = DataDependent().to(cuda)
    config = CompilationConfig(splitting_ops=DATA_DEPENDENT_OPS, cudagraph_mode=mode, cudagraph_capture_sizes=SIZES)
    compiled = pieceworks.compile(model, config)
    refused = 3 if mode.has_full else 2  # the FULL graph, the piece reading the rows, the piece with .item()
    with counters.expect(num_cudagraph_uncapturable=refused):
        compiled(_batches(cuda, nonempty=True)[0][:3])
    with counters.expect(num_cudagraph_captured=len(SIZES)):  # the first piece, once per size
        compiled.capture()
    for x in _batches(cuda, nonempty=True) + _batches(cuda, nonempty=True):
        torch.testing.assert_close(compiled(x).clone(), model(x))
    items = compiled.runtime.graph.pieces
    text = caplog.text
    assert text.count(f"piece {items[2].submod_name} runs without a CUDA graph: its sizes depend on data") == 1
    assert text.count(f"piece {items[4].submod_name} runs without a CUDA graph") == 1
    assert "synchronises with the host" in text


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("splitting_ops", [[], ["silly::attention"]])
def test_piecewise_without_a_splitting_op_captures_the_one_piece_per_size(splitting_ops, caplog, cuda):
    """vLLM's behaviour: PIECEWISE on a graph that nothing splits captures its one piece per size (a FULL graph)."""
    caplog.set_level(logging.INFO, logger="pieceworks")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16)).to(cuda)
    config = CompilationConfig(splitting_ops=splitting_ops, compiler="eager", cudagraph_capture_sizes=SIZES)
    compiled = pieceworks.compile(model, config)
    compiled(torch.randn(3, 16, device=cuda))
    assert compiled.runtime.mode is CUDAGraphMode.PIECEWISE and len(compiled.runtime.graph.pieces) == 1
    with counters.expect(num_cudagraph_captured=len(SIZES)):
        compiled.capture()
    assert set(compiled.runtime.captured_sizes) == set(SIZES)
    for batch in [1, 3, 8, 13, 16, 40]:
        x = torch.randn(batch, 16, device=cuda)
        torch.testing.assert_close(compiled(x).clone(), model(x), rtol=1e-5, atol=1e-5)
    assert caplog.text.count("its one piece is captured per size") == 1
    assert ("never called" in caplog.text) == bool(splitting_ops)
