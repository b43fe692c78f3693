"""Tensor parallel on CPUs: 2 processes over gloo (`torch.multiprocessing.spawn`), the Llama model sharded
(`llama.shard`: heads and MLP columns split, an all-reduce after each layer's attention and MLP).

- Sharded and compiled, every rank's output equals the whole model's, whether the all-reduces run inside the
  pieces (compiled with Inductor) or as splitting ops between them.
- The compile cache under TP: both ranks share one cache folder; their code is the same, so is their key (a world
  size changes the shards' shapes, which the key covers); a second start of both ranks compiles nothing.
- Before capturing, ranks check that they will capture the same: a rank whose sizes differ makes every rank raise
  `CaptureMismatchError` naming it and its sizes, instead of waiting on the others forever.
Every test runs under a timeout, and the process group's own timeout bounds a collective that would hang.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import torch

import pieceworks
from pieceworks import CaptureMismatchError, CompilationConfig, counters
from pieceworks.harness import llama, models
from suites.benchmarks._shared import spawn_ranks

pytestmark = pytest.mark.timeout(300)


def _sharded_against_whole(rank: int, folder: Path, splitting: list[str], compiler: str = "inductor") -> dict:
    torch.manual_seed(0)
    whole = llama.Llama(llama.TINY)
    sharded = llama.shard(copy.deepcopy(whole))
    compiled = pieceworks.compile(sharded, CompilationConfig(splitting_ops=splitting, compiler=compiler,
                                                             cache_dir=str(folder / "cache")))
    compiles, errors = counters.num_inductor_compiles, []
    with torch.no_grad():
        for batch in (5, 3, 8):
            expected = whole(*llama.decode_batch(whole, batch, seed=batch))
            got = compiled(*llama.decode_batch(sharded, batch, seed=batch))
            errors.append(float((got - expected).abs().max()))
    return {"errors": errors, "compiles": counters.num_inductor_compiles - compiles,
            "key": os.path.basename(compiled.runtime.graph.cache_dir or ""),
            "splitting_pieces": sum(p.is_splitting_graph for p in compiled.runtime.graph.pieces)}


def test_all_reduces_as_splitting_ops_give_the_whole_models_output_on_every_rank(tmp_path):
    ranks = spawn_ranks(_sharded_against_whole, tmp_path, llama.SPLITTING_OPS + [llama.ALL_REDUCE], "eager")
    assert max(max(r["errors"]) for r in ranks) < 1e-4, ranks
    # each layer split by its attention op and by its two all-reduces
    assert [r["splitting_pieces"] for r in ranks] == [3 * llama.TINY.num_layers] * 2


def test_all_reduces_in_pieces_give_the_whole_models_output_and_ranks_share_one_cache_entry(tmp_path):
    cold = spawn_ranks(_sharded_against_whole, tmp_path, llama.SPLITTING_OPS)
    assert max(max(r["errors"]) for r in cold) < 1e-4, cold
    assert [r["splitting_pieces"] for r in cold] == [llama.TINY.num_layers] * 2  # the attention ops alone
    warm = spawn_ranks(_sharded_against_whole, tmp_path, llama.SPLITTING_OPS)
    assert cold[0]["key"] == cold[1]["key"] == warm[0]["key"]  # the same code on every rank: one cache entry
    assert sum(r["compiles"] for r in cold) > 0 and [r["compiles"] for r in warm] == [0, 0]
    assert max(max(r["errors"]) for r in warm) < 1e-4



def _agree(rank: int, folder: Path, sizes_of_rank_1: list[int]) -> dict:
    compiled = pieceworks.compile(models.SillyModel(), CompilationConfig(
        splitting_ops=models.SPLITTING_OPS, compiler="eager",
        cudagraph_capture_sizes=[1, 2, 4, 8] if rank == 0 else sizes_of_rank_1))
    compiled(torch.randn(3))
    try:  # the capture phase of the runtime (the compiled model's own passes no size on a machine without CUDA)
        compiled.runtime.capture(lambda size: None)
    except CaptureMismatchError as exc:
        return {"error": str(exc)}
    return {"error": None}


def test_ranks_that_would_capture_different_sizes_all_raise_naming_the_rank_that_differs(tmp_path):
    assert [r["error"] for r in spawn_ranks(_agree, tmp_path, [2, 8, 1, 4])] == [None, None]  # the same, in any order
    ranks = spawn_ranks(_agree, tmp_path, [8, 4, 1])
    for rank in ranks:
        assert rank["error"] is not None and "rank 0: NONE [8, 4, 2, 1]; rank 1: NONE [8, 4, 1]" in rank["error"]
        assert "Fix: the same cudagraph_mode, cudagraph_capture_sizes" in rank["error"]
