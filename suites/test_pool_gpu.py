"""Pool sharing, capture order and memory over time, through the implementation adapters.

Written against `harness.adapters` (`Built.capture_order`, `Built.pool`), so that the conformance suite can
run them for any implementation that claims `shared_pool`:
- the capture order is largest size first (smaller sizes then reuse the blocks the larger ones left free);
- one pool for all sizes costs about what the largest size alone costs: pool bytes (the allocator's segments
  of the graph pool) for all sizes <= 1.05 x the pool of the largest size alone, and less than one pool per
  size;
- thousands of replays of random sizes grow none of this process's own allocations (the pool, the allocator's
  allocated and reserved bytes, its live blocks), while another process takes device memory meanwhile
  (device-wide readings would call that growth), and give eager's results.
And, through pieceworks itself: the pool estimate read before capture is close to the capture's pool, counts
what the smaller sizes add to the largest one's pool, and frees its sample; compiled pieces warm up once per
pool, FULL graphs at every size.
"""

from __future__ import annotations

import contextlib
import gc
import random
import subprocess
import sys
from collections.abc import Iterator

import pytest
import torch
import torch.nn as nn

import pieceworks
from pieceworks.cudagraph import CapturePool
from pieceworks.harness.adapters import Pieceworks
from pieceworks.harness.measure.memory import own_memory, pool_bytes
from pieceworks.harness.models import toy as models
from pieceworks.runtime import Phase

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(150)]

SHARED_POOL = [Pieceworks("PIECEWISE", compiler="eager"), Pieceworks("FULL", compiler="eager")]
IDS = [impl.name for impl in SHARED_POOL]

# Wide enough that every size from 64 rows up allocates megabyte blocks: the pool of the largest size is
# hundreds of MiB, and the one 2 MiB small-block segment that sizes 1 and 8 need stays far inside the 5%
# allowance.
WIDE = models.ToyLlamaConfig(hidden_size=4096, mlp_size=8192, vocab_size=128, num_layers=2)
WIDE_SIZES = [1, 8, 64, 256, 512]
SMALL = models.ToyLlamaConfig(num_layers=2)
SMALL_SIZES = [1, 2, 4, 8, 16, 32, 64]


def _toy(config):
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = models.ToyLlama(config)
    return model, lambda b: models.toy_llama_inputs(b, config, "cuda", seed=b)


def _build(impl, model, inputs, sizes):
    torch._dynamo.reset()
    built = impl.build(model, inputs, sizes, models.SPLITTING_OPS)
    torch.cuda.synchronize()
    assert built.pool is not None, f"{impl.name} claims a shared pool but its adapter exposes none"
    return built


@pytest.mark.parametrize("impl", SHARED_POOL, ids=IDS)
def test_capture_order_is_largest_first(impl):
    model, inputs = _toy(SMALL)
    sizes = [4, 64, 1, 16, 2, 32, 8]
    built = _build(impl, model, inputs, sizes)
    assert built.capture_order == sorted(sizes, reverse=True)


@pytest.fixture(scope="module")
def wide_model():
    model, inputs = _toy(WIDE)
    yield model, inputs
    del model
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.parametrize("impl", SHARED_POOL, ids=IDS)
def test_one_pool_for_all_sizes_costs_no_more_than_the_largest_alone(impl, wide_model):
    model, inputs = wide_model
    shared = pool_bytes(_build(impl, model, inputs, WIDE_SIZES).pool)
    largest = pool_bytes(_build(impl, model, inputs, [max(WIDE_SIZES)]).pool)
    assert largest > 0, "capturing the largest size put nothing in its pool"
    assert shared <= 1.05 * largest, (
        f"{impl.name}: one pool for sizes {WIDE_SIZES} holds {shared / 2**20:.1f} MiB, the largest size "
        f"alone {largest / 2**20:.1f} MiB: smaller sizes should reuse the blocks the larger ones freed"
    )


def test_one_pool_for_all_sizes_is_smaller_than_one_pool_each(wide_model):
    """Pool bytes (segments of each graph pool), not reserved deltas: those include each model's warm-up
    MemPool."""
    model, inputs = wide_model
    impl = SHARED_POOL[0]
    shared = pool_bytes(_build(impl, model, inputs, WIDE_SIZES).pool)
    separate = {}
    for size in WIDE_SIZES:
        built = _build(impl, model, inputs, [size])
        separate[size] = pool_bytes(built.pool)
        del built
    assert shared < sum(separate.values()), (shared, separate)


NEIGHBOUR = """
import sys
import torch
try:
    held = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    print("holds 256 MiB", flush=True)
except Exception as exc:  # an exclusive-process GPU, say
    print(f"cannot allocate: {type(exc).__name__}: {exc}", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def _another_process_on_the_gpu() -> Iterator[str]:
    """Another process holding 256 MiB of device memory for the block; yields what it said."""
    proc = subprocess.Popen(
        [sys.executable, "-c", NEIGHBOUR], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        yield proc.stdout.readline().strip()
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("impl", SHARED_POOL, ids=IDS)
def test_thousands_of_replays_grow_no_memory(impl):
    """This process's own allocations only: another process takes 256 MiB of the device while the replays
    run."""
    model, inputs = _toy(SMALL)
    top = max(SMALL_SIZES)
    built = _build(impl, model, inputs, SMALL_SIZES)
    batches = list(range(1, top + 17))  # every padded size, every captured size, and some above the largest
    rng = random.Random(0)
    stream = [rng.choice(batches) for _ in range(2000)]
    args = {b: inputs(b) for b in batches}
    expected = {b: model(*args[b]) for b in batches}
    # warm: the allocator has served this very sequence once (sizes above the largest eagerly)
    for batch in stream:
        out = built(*args[batch])
    del out
    gc.collect()
    before = own_memory(built.pool)
    with _another_process_on_the_gpu() as neighbour:
        for i, batch in enumerate(stream):
            out = built(*args[batch])
            if i % 50 == 0:
                torch.testing.assert_close(
                    out, expected[batch], rtol=1e-4, atol=1e-5, msg=f"call {i}, batch {batch}"
                )
        del out
        gc.collect()
        after = own_memory(built.pool)
    assert after == before, f"over 2000 replays ({neighbour} meanwhile): before {before}, after {after}"


def _compiled(model, inputs, mode, sizes):
    torch._dynamo.reset()
    compiled = pieceworks.compile(
        model,
        pieceworks.CompilationConfig(
            splitting_ops=models.SPLITTING_OPS,
            cudagraph_mode=mode,
            cudagraph_capture_sizes=sizes,
            compiler="eager",
        ),
    )
    compiled(*inputs(3))
    return compiled


@pytest.mark.parametrize("mode", ["PIECEWISE", "FULL"])
def test_the_pool_estimate_comes_before_capture_frees_its_sample_and_is_close(mode, wide_model):
    model, inputs = wide_model
    compiled = _compiled(model, inputs, mode, WIDE_SIZES)
    torch.cuda.synchronize()
    reserved = torch.cuda.memory_reserved()
    estimate = compiled.estimate_capture(samples=3)
    assert estimate["sampled_sizes"] == [512, 64, 1] and estimate["sizes"] == len(WIDE_SIZES)
    assert compiled.runtime.captured_sizes == () and compiled.runtime.phase is Phase.WAITING
    # what stays: the capture stream's warm-up MemPool (its cuBLAS workspace), far below the sample's pool
    assert torch.cuda.memory_reserved() - reserved < 0.5 * estimate["largest_bytes"], (
        "the sample pool was not freed"
    )
    compiled.capture()
    actual = pool_bytes(compiled.runtime.pool.handle)
    assert 0.8 * actual <= estimate["pool_bytes"] <= 1.25 * actual, (estimate, actual)
    # fp32 GEMMs of 300 and 512 rows round differently: relative to the largest value
    for batch in (1, 8, 300):
        out, want = compiled(*inputs(batch)), model(*inputs(batch))
        assert float((out - want).abs().max() / want.abs().max()) < 1e-5


class _Widening(nn.Module):
    """`relu(x @ w1) @ w2` in float32 with 1024 features: 2 MiB tensors at 512 rows, which the caching
    allocator serves from large-block segments (requests above 1 MiB), and 256 KiB or less at 64 rows and
    below, served from small-block segments (2 MiB each), which the largest size never asks for: the smaller
    sizes add to its pool."""

    def __init__(self) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(1024, 1024) / 32)
        self.w2 = nn.Parameter(torch.randn(1024, 1024) / 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ self.w1) @ self.w2


WIDENING_SIZES = [1, 8, 64, 512]


@pytest.mark.parametrize("mode", ["PIECEWISE", "FULL"])
def test_the_pool_estimate_counts_what_smaller_sizes_add(mode):
    """The estimate is nearer the capture's pool than the largest size's pool alone is: an estimate of the
    largest size alone misses what the smaller sizes add."""
    torch.manual_seed(0)
    model = _Widening().cuda()

    def inputs(batch):
        return (torch.randn(batch, 1024, device="cuda"),)

    alone = _compiled(model, inputs, mode, [max(WIDENING_SIZES)])
    alone.capture()
    largest = pool_bytes(alone.runtime.pool.handle)
    del alone
    gc.collect()
    torch.cuda.empty_cache()
    compiled = _compiled(model, inputs, mode, WIDENING_SIZES)
    estimate = compiled.estimate_capture(samples=3)
    compiled.capture()
    actual = pool_bytes(compiled.runtime.pool.handle)
    added = actual - largest
    assert added >= 2 * 2**20, (
        f"the smaller sizes should add at least a 2 MiB small-block segment to the pool of "
        f"size {max(WIDENING_SIZES)} ({largest} bytes alone, {actual} with every size)"
    )
    assert abs(estimate["pool_bytes"] - actual) <= added / 2, (
        f"estimate {estimate['pool_bytes']} bytes, captured {actual}, the largest size alone {largest}: the "
        f"smaller sizes add {added} bytes, which the estimate must count"
    )
    for batch in (1, 5, 64, 300):
        x = inputs(batch)
        torch.testing.assert_close(compiled(*x).clone(), model(*x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("mode", ["PIECEWISE", "FULL"])
def test_each_runnable_warms_up_once_per_size_full_graphs_at_every_size(mode, monkeypatch):
    """Every size warms up (cuBLAS picks other kernels, and may allocate a workspace, for other shapes: inside
    a capture that allocation would be pinned in the graph pool); identical pieces share their runnable's
    warm-up."""
    warmups = []
    capture = CapturePool.capture

    def counted(self, fn, args, mutated, runs=None):
        warmups.append(self.num_warmups if runs is None else runs)
        return capture(self, fn, args, mutated, runs)

    monkeypatch.setattr(CapturePool, "capture", counted)
    model, inputs = _toy(models.ToyLlamaConfig(num_layers=4))  # 3 identical middle pieces
    sizes = [1, 2, 4]
    compiled = _compiled(model, inputs, mode, sizes)
    compiled.capture()
    pieces = [p for p in compiled.runtime.compiled.pieces if not p.is_splitting_graph]
    distinct = len({p.runnable(4) for p in pieces})
    assert distinct < len(pieces), "the model should have identical pieces"
    if mode == "FULL":
        assert warmups == [1] * len(sizes)
    else:
        assert len(warmups) == len(sizes) * len(pieces) and sum(warmups) == len(sizes) * distinct, warmups
    for batch in (1, 2, 3, 4):
        torch.testing.assert_close(compiled(*inputs(batch)), model(*inputs(batch)), rtol=1e-4, atol=1e-5)
