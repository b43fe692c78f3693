"""Tensor parallel on 2 GPUs (NCCL): 4 layers of Llama-3.1-8B's shape in bfloat16, sharded over 2 ranks
(`llama.shard`: heads and MLP columns split, an all-reduce after each layer's attention and MLP).

Each rank builds eager, pieceworks PIECEWISE and FULL (the all-reduces inside the captured pieces; vLLM's 51
capture sizes up to 512) on its shard, checks every output against its shard run eagerly, and times batches 1,
2, 8, 64, 256 and 512 side by side in rotating rounds (`timing.interleaved_cuda_time_us`, 10 rounds of 20
samples after 20 warm-up calls). Both ranks run the same calls in the same order, as their collectives
require; the times are rank 0's CUDA events, so they include waiting for the other rank. The details file also
holds each rank's graph-pool MiB after capturing the 51 sizes. Skipped, with the reason, without 2 CUDA
devices.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from . import _shared
from ._shared import BATCHES
from .latency import _Latency

IMPLEMENTATIONS = ["eager", "pieceworks-piecewise", "pieceworks-full"]
MODEL = "llama_8b_4l"
REPS, ROUNDS, WARMUP = 200, 10, 20
DETAILS = "latency_llama_8b_4l_tp2_bfloat16"  # the report's latency table of this model


def _rank(rank: int, folder: Path) -> dict:
    """One rank's part (`_shared.spawn_ranks`): its pool MiB per mode and, per batch and implementation, the
    median and IQR µs and the largest error against its shard run eagerly."""
    import torch

    import pieceworks
    from pieceworks.harness.measure.memory import pool_bytes
    from pieceworks.harness.measure.timing import interleaved_cuda_time_us
    from pieceworks.harness.models import llama

    model, make_inputs, splitting_ops = _shared.model_and_inputs(
        MODEL, "bfloat16"
    )  # the same seed on every rank
    llama.shard(model)
    built, pools = {"eager": model}, {}
    with torch.no_grad():
        for name, mode in (("pieceworks-piecewise", "PIECEWISE"), ("pieceworks-full", "FULL")):
            compiled = pieceworks.compile(
                model,
                pieceworks.CompilationConfig(
                    splitting_ops=splitting_ops,
                    cudagraph_mode=mode,
                    cudagraph_capture_sizes=pieceworks.default_capture_sizes(_shared.MAX_CAPTURE),
                ),
            )
            compiled(*make_inputs(3))
            compiled.capture()
            built[name], pools[name] = compiled, pool_bytes(compiled.runtime.pool.handle) / 2**20
        results = {}
        for batch in BATCHES:
            inputs = make_inputs(batch)
            expected = model(*inputs).float()
            errors = {
                name: float((fn(*inputs).float() - expected).abs().max() / expected.abs().max())
                for name, fn in built.items()
            }
            timed = interleaved_cuda_time_us(
                {name: (lambda fn=fn: fn(*inputs)) for name, fn in built.items()},  # noqa: B023 - timed within this iteration
                warmup=WARMUP,
                reps=REPS,
                rounds=ROUNDS,
            )
            results[str(batch)] = {
                name: {"median_us": t["median_us"], "iqr_us": t["iqr_us"], "max_rel_error": errors[name]}
                for name, t in timed.items()
            }
    return {"pool_mib": pools, "results": results}


def measure() -> dict:
    """`{(implementation, batch): {"median_us", "iqr_us", "max_rel_error"}}` of rank 0, or
    `{"skip": reason}`."""
    import torch

    if torch.cuda.device_count() < 2:
        reason = (
            f"needs 2 CUDA devices: torch {torch.__version__} sees {torch.cuda.device_count()} (run asv on a "
            "runner with two GPUs)"
        )
        _shared.write_details(DETAILS, {"skip": reason})
        return {"skip": reason}
    _shared.run_dir()
    with tempfile.TemporaryDirectory(prefix="pieceworks-tp-") as folder:
        ranks = _shared.spawn_ranks(_rank, Path(folder), backend="nccl")
    _shared.write_details(
        DETAILS,
        {
            "model": MODEL,
            "dtype": "bfloat16",
            "world_size": len(ranks),
            "pool_mib_by_rank": [r["pool_mib"] for r in ranks],
            "entries": ranks[0]["results"],
        },
    )
    return {
        (name, int(batch)): entry for batch, row in ranks[0]["results"].items() for name, entry in row.items()
    }


class TensorParallelLlama8B4LayersBfloat16(
    _Latency
):  # the latency classes' setup and tracks, rank 0's numbers
    params = [IMPLEMENTATIONS, BATCHES]

    def setup_cache(self):
        return measure()
