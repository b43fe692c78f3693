"""Tensor parallel on 2 GPUs over NCCL: the sharded Llama's all-reduces captured in CUDA graphs.

- PIECEWISE (all-reduces inside the captured pieces, or as splitting ops between them) and FULL: after
  capture, replays of captured sizes, padded sizes and a size above the largest give the whole model's output
  on every rank, and never hang (the ranks are terminated after 150 s, a collective replayed from a graph
  escaping the group's own timeout; every test has its own).
- Once the compiled model is dropped, its graphs go with it and the NCCL process group closes (graphs holding
  collectives that stay alive keep it from closing).
- A rank configured with other capture sizes fails fast on every rank with `CaptureMismatchError` naming it,
  instead of capturing graphs whose collectives would wait on each other.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path

import pytest
import torch

import pieceworks
from pieceworks import CaptureMismatchError, CompilationConfig
from pieceworks.harness.models import llama
from suites.benchmarks._shared import spawn_ranks

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(200),
    pytest.mark.skipif(
        torch.cuda.device_count() < 2,
        reason=f"needs 2 CUDA devices, torch {torch.__version__} sees "
        f"{torch.cuda.device_count()}: run `pytest -m gpu` on a machine with two GPUs",
    ),
]
SIZES = [1, 2, 4, 8]


def _captured_against_whole(
    rank: int, folder: Path, mode: str, splitting: list[str], sizes: list[int]
) -> dict:
    torch.manual_seed(0)
    whole = llama.Llama(llama.TINY).cuda()
    sharded = llama.shard(copy.deepcopy(whole))
    compiled = pieceworks.compile(
        sharded,
        CompilationConfig(
            splitting_ops=splitting, cudagraph_mode=mode, cudagraph_capture_sizes=sizes, cache_enabled=False
        ),
    )
    errors = []
    with torch.no_grad():
        # the same first call (the same cache writes) on both
        whole(*llama.decode_batch(whole, 3, device="cuda"))
        compiled(*llama.decode_batch(sharded, 3, device="cuda"))
        start = time.perf_counter()
        try:
            compiled.capture()
        except CaptureMismatchError as exc:
            return {"mismatch": str(exc), "seconds": time.perf_counter() - start}
        for batch in (8, 3, 1, 5, 12):  # captured, padded, captured, padded, above the largest
            expected = whole(*llama.decode_batch(whole, batch, device="cuda", seed=batch))
            got = compiled(*llama.decode_batch(sharded, batch, device="cuda", seed=batch))
            errors.append(float((got - expected).abs().max()))
    torch.cuda.synchronize()
    return {"errors": errors, "captured": list(compiled.runtime.captured_sizes), "mismatch": None}


@pytest.mark.parametrize(
    "mode, all_reduce", [("PIECEWISE", "in pieces"), ("PIECEWISE", "splitting op"), ("FULL", "in pieces")]
)
def test_captured_all_reduces_replay_the_whole_models_output_on_every_rank(tmp_path, mode, all_reduce):
    splitting = llama.SPLITTING_OPS + (llama.ALL_REDUCE if all_reduce == "splitting op" else [])
    ranks = spawn_ranks(
        _captured_against_whole, tmp_path, mode, splitting, SIZES, backend="nccl", timeout=150
    )
    for rank in ranks:
        assert rank["captured"] == sorted(SIZES, reverse=True), ranks
        assert max(rank["errors"]) < 1e-3, ranks
        # the dropped model's graphs, holding NCCL kernels, were freed
        assert rank["process_group_closed"], ranks


def _rank_1_other_sizes(rank: int, folder: Path) -> dict:
    return _captured_against_whole(
        rank, folder, "PIECEWISE", llama.SPLITTING_OPS, SIZES if rank == 0 else [1, 4, 8]
    )


def test_ranks_with_other_capture_sizes_fail_fast_naming_the_rank(tmp_path):
    ranks = spawn_ranks(_rank_1_other_sizes, tmp_path, backend="nccl", timeout=150)
    for rank in ranks:
        assert "rank 0: PIECEWISE [8, 4, 2, 1]; rank 1: PIECEWISE [8, 4, 1]" in rank["mismatch"], ranks
        assert rank["seconds"] < 30  # an all-gather, not a collective's timeout
