"""Memory (implementations that claim a shared pool, or CUDA graphs), on the CUDA caching allocator.

- capture-largest-first: the build captured its sizes largest first (smaller sizes then reuse the blocks the
  larger ones freed); needs an observable `Built.capture_order`.
- one-pool-for-all-sizes: the pool holding every captured size has at most 1.05x the bytes of a build
  capturing the largest size alone; needs an observable `Built.pool`. (The suite's models are small: their
  pools are a few small-block segments; test_pool_gpu.py measures pieceworks on a model whose pools are
  hundreds of MiB.)
- replays-grow-no-memory: a stream of random sizes of the run's sweep (captured, padded, above), served twice
  by the same loop (the same calls, the same checks, each output held until the next call returns): reserved
  bytes (and the pool's, where observable) are the same after the second pass as before it; outputs stay
  eager's (silly-inplace's write is idempotent, so the stream's reused arguments give the same outputs). The
  warm pass must be the measured one: a pass that dropped each output at once, or ran no checks, would leave
  the allocator unready for the peak of the pass that does, and a runtime that needs one more small segment
  for it leaks nothing. A failure names the calls at which reserved bytes grew.
"""

from __future__ import annotations

import gc
import random

import pytest
import torch

from pieceworks.harness.measure.memory import pool_bytes

from .checks import assert_same, clone
from .subjects import make_inputs


@pytest.mark.conformance("capture-largest-first")
def test_sizes_are_captured_largest_first(served, plan):
    _, built = served
    assert built.capture_order == sorted(plan.capture_sizes, reverse=True)


@pytest.mark.conformance("one-pool-for-all-sizes")
def test_one_pool_for_all_sizes_costs_no_more_than_the_largest_alone(subject, served, builds, device, plan):
    model, built = served
    sizes = list(plan.capture_sizes)
    shared = pool_bytes(built.pool)
    try:
        alone = subject.impl.build(
            model, make_inputs(subject.case, device), [max(sizes)], list(subject.case.splitting_ops)
        )
        torch.cuda.synchronize()
        largest = pool_bytes(alone.pool)
    finally:
        builds.drop()  # a second build may have reset Dynamo under the first: build again for later tests
    assert largest > 0, "capturing the largest size alone put nothing in its pool"
    assert shared <= 1.05 * largest, (
        f"one pool for sizes {sizes} holds {shared / 2**20:.2f} MiB, the largest size alone "
        f"{largest / 2**20:.2f} MiB: smaller sizes should reuse the blocks the larger ones freed"
    )


@pytest.mark.conformance("replays-grow-no-memory")
def test_replays_of_random_sizes_grow_no_memory(subject, served, device, plan):
    model, built = served
    case = subject.case
    args = {b: case.inputs(b, 8000 + b, device) for b in plan.batches}
    expected = {b: model(*clone(args[b])) for b in plan.batches}
    rng = random.Random(plan.seed)
    stream = [rng.choice(plan.batches) for _ in range(300)]

    def measure():
        gc.collect()
        torch.cuda.synchronize()
        return {
            "reserved": torch.cuda.memory_reserved(),
            "pool": pool_bytes(built.pool) if built.pool is not None else None,
        }

    def serve() -> list[str]:
        """One pass of the stream; where reserved bytes grew: "call i (batch b): +n bytes"."""
        grew, out, reserved = [], None, torch.cuda.memory_reserved()
        for i, batch in enumerate(stream):
            out = built(*args[batch])
            if i % 25 == 0:
                assert_same(out, expected[batch], f"call {i} (batch {batch})")
            if (now := torch.cuda.memory_reserved()) != reserved:
                grew.append(f"call {i} (batch {batch}): {now - reserved:+} bytes")
                reserved = now
        del out
        return grew

    serve()  # warm: every size served, every recording made, the measured pass's peak reached once
    before = measure()
    grew = serve()
    after = measure()
    assert after == before, (
        f"allocator bytes before {before}, after {len(stream)} more calls {after}; reserved grew at "
        f"{'; '.join(grew[:5]) or 'no call (between calls)'}"
    )
