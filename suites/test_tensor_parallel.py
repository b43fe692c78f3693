"""Tensor parallel on CPUs: 2 processes over gloo (`torch.multiprocessing.spawn`), the Llama model sharded
(`llama.shard`: heads and MLP columns split, an all-reduce after each layer's attention and MLP).

- Sharded and compiled, every rank's output equals the whole model's, whether the all-reduces run inside the
  pieces (compiled with Inductor) or as splitting ops between them.
- The compile cache under TP: both ranks share one cache folder; their code is the same, so is their key (a
  world size changes the shards' shapes, which the key covers); a second start of both ranks compiles nothing.
- Before capturing a graph that holds collectives, ranks check that they will capture the same: a rank whose
  sizes differ makes every rank raise `CaptureMismatchError` naming it and its sizes, instead of waiting on
  the others forever; a graph without collectives compares nothing.
- A compiled shard that its caller drops is freed (Dynamo keeps the compiled functions of graphs holding
  collectives in a module: they must not hold the model, whose CUDA graphs would keep the NCCL group from
  closing).
- The suites' rank launcher starts ranks whose code asv imported through its own import hook (which spawned
  processes do not inherit), as the tensor-parallel benchmark's are.
Every test runs under a timeout, and the process group's own timeout bounds a collective that would hang.
"""

from __future__ import annotations

import copy
import gc
import importlib
import os
import sys
import weakref
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import pieceworks
from pieceworks import CaptureMismatchError, CompilationConfig, counters
from pieceworks.harness.models import llama
from pieceworks.harness.models import toy as models
from suites.benchmarks._shared import spawn_ranks

pytestmark = pytest.mark.timeout(300)


def _sharded_against_whole(folder: Path, splitting: list[str], compiler: str = "inductor") -> dict:
    torch.manual_seed(0)
    whole = llama.Llama(llama.TINY)
    sharded = llama.shard(copy.deepcopy(whole))
    compiled = pieceworks.compile(
        sharded,
        CompilationConfig(splitting_ops=splitting, compiler=compiler, cache_dir=str(folder / "cache")),
    )
    compiles, errors = counters.num_inductor_compiles, []
    with torch.no_grad():
        for batch in (5, 3, 8):
            expected = whole(*llama.decode_batch(whole, batch, seed=batch))
            got = compiled(*llama.decode_batch(sharded, batch, seed=batch))
            errors.append(float((got - expected).abs().max()))
    return {
        "errors": errors,
        "compiles": counters.num_inductor_compiles - compiles,
        "key": os.path.basename(compiled.runtime.compiled.cache_dir or ""),
        "splitting_pieces": sum(p.is_splitting_graph for p in compiled.runtime.compiled.pieces),
    }


class _Reduces(torch.nn.Module):
    def forward(self, x):
        return funcol.all_reduce(x * 2, "sum", dist.group.WORLD) + 1


def _capture_error(rank: int, sizes_of_rank_1: list[int], model: torch.nn.Module) -> str | None:
    """The error of the runtime's capture phase (the compiled model's own passes no size without CUDA), or
    None."""
    compiled = pieceworks.compile(
        model,
        CompilationConfig(
            splitting_ops=models.SPLITTING_OPS,
            compiler="eager",
            cudagraph_capture_sizes=[1, 2, 4, 8] if rank == 0 else sizes_of_rank_1,
        ),
    )
    compiled(torch.randn(3))
    try:
        with compiled.runtime.capture_phase():
            pass
    except CaptureMismatchError as exc:
        return str(exc)
    return None


def _freed_when_dropped() -> bool:
    """Whether a compiled shard (collectives in its graph: Dynamo keeps its compiled function in a module) is
    freed, with its runtime, once dropped."""
    compiled = pieceworks.compile(
        llama.shard(llama.Llama(llama.TINY)),
        CompilationConfig(splitting_ops=llama.SPLITTING_OPS, compiler="eager", cache_enabled=False),
    )
    with torch.no_grad():
        compiled(*llama.decode_batch(compiled.model, 3))
    held = [weakref.ref(compiled), weakref.ref(compiled.runtime)]
    del compiled
    gc.collect()
    return all(ref() is None for ref in held)


def _first_start(rank: int, folder: Path) -> dict:
    """Every check of a rank's first start, in one process group (the same calls on both ranks, in one
    order)."""
    return {
        "in pieces": _sharded_against_whole(folder, llama.SPLITTING_OPS),
        "splitting op": _sharded_against_whole(folder, llama.SPLITTING_OPS + llama.ALL_REDUCE, "eager"),
        "same sizes": _capture_error(rank, [2, 8, 1, 4], _Reduces()),
        "other sizes": _capture_error(rank, [8, 4, 1], _Reduces()),
        "no collectives": _capture_error(rank, [8, 4, 1], models.SillyModel()),
        "freed": _freed_when_dropped(),
    }


def _warm_start(rank: int, folder: Path) -> dict:
    return _sharded_against_whole(folder, llama.SPLITTING_OPS)


@pytest.fixture(scope="module")
def first_start(tmp_path_factory) -> tuple[Path, list[dict]]:
    folder = tmp_path_factory.mktemp("tensor-parallel")
    return folder, spawn_ranks(_first_start, folder)


def test_all_reduces_as_splitting_ops_give_the_whole_models_output_on_every_rank(first_start):
    ranks = [r["splitting op"] for r in first_start[1]]
    assert max(max(r["errors"]) for r in ranks) < 1e-4, ranks
    # each layer split by its attention op and by its two all-reduces
    assert [r["splitting_pieces"] for r in ranks] == [3 * llama.TINY.num_layers] * 2


def test_all_reduces_in_pieces_give_the_whole_models_output_and_ranks_share_one_cache_entry(first_start):
    folder, cold = first_start[0], [r["in pieces"] for r in first_start[1]]
    assert max(max(r["errors"]) for r in cold) < 1e-4, cold
    assert [r["splitting_pieces"] for r in cold] == [llama.TINY.num_layers] * 2  # the attention ops alone
    warm = spawn_ranks(_warm_start, folder)
    assert cold[0]["key"] == cold[1]["key"] == warm[0]["key"]  # the same code on every rank: one cache entry
    assert sum(r["compiles"] for r in cold) > 0 and [r["compiles"] for r in warm] == [0, 0]
    assert max(max(r["errors"]) for r in warm) < 1e-4


def test_a_dropped_compiled_shard_is_freed(first_start):
    # its CUDA graphs would keep the NCCL group from closing
    assert [r["freed"] for r in first_start[1]] == [True, True]


def test_ranks_that_would_capture_different_sizes_all_raise_naming_the_rank_that_differs(first_start):
    assert [r["same sizes"] for r in first_start[1]] == [None, None]  # the same sizes, in any order
    # a graph without collectives compares nothing: ranks that never meet (data-parallel replicas)
    # capture freely
    assert [r["no collectives"] for r in first_start[1]] == [None, None]
    for rank in first_start[1]:
        error = rank["other sizes"]
        assert error is not None and "rank 0: NONE [8, 4, 2, 1]; rank 1: NONE [8, 4, 1]" in error
        assert "Fix: the same cudagraph_mode, cudagraph_capture_sizes" in error


def _sum_of_ranks(rank: int, folder: Path) -> dict:
    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    return {"sum": float(total)}


def test_ranks_start_from_benchmarks_imported_the_way_asv_imports_them(monkeypatch, tmp_path):
    suites = str(Path(__file__).parent)

    class Finder:  # asv's import hook, in short: `benchmarks` from its folder, which sys.path does not hold
        @staticmethod
        def find_spec(name, path=None, target=None):
            return importlib.machinery.PathFinder.find_spec(name, [suites]) if name == "benchmarks" else None

    monkeypatch.setattr(sys, "path", [p for p in sys.path if os.path.abspath(p) != suites])
    monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    for name in [n for n in sys.modules if n.split(".")[0] == "benchmarks"]:
        monkeypatch.delitem(sys.modules, name)
    try:
        shared = importlib.import_module("benchmarks._shared")
        ranks = shared.spawn_ranks(_sum_of_ranks, tmp_path)
        assert [(r["sum"], r["process_group_closed"]) for r in ranks] == [(3.0, True)] * 2
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] == "benchmarks"]:
            del sys.modules[name]
    assert suites not in sys.path  # the launcher's path change lasts only while it starts the ranks
