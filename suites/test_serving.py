"""harness/models/serving.py: the scheduler's steps serve every request exactly as its lengths say, under the
budget and the slot limit; the traces have the shape they claim; cache blocks are never shared; and continuous
batching on the Llama model gives every request what it gets alone."""

from __future__ import annotations

import collections

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import pieceworks
from pieceworks.harness.models import llama as L
from pieceworks.harness.models import serving as S

requests_st = st.lists(st.builds(S.Request, st.integers(1, 40), st.integers(1, 12)), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(
    requests=requests_st,
    budget=st.integers(4, 48),
    seqs=st.integers(1, 4),
    gaps=st.lists(st.integers(0, 6), min_size=12, max_size=12),
)
def test_steps_serve_each_request_its_positions_in_order_within_budget_and_slots(
    requests, budget, seqs, gaps
):
    arrivals = [sum(gaps[: i + 1]) for i in range(len(requests))]
    steps = S.schedule(requests, budget, seqs, arrivals)
    seen = collections.defaultdict(list)  # request -> its positions, in the order served
    slot_of, live = {}, {}  # request -> slot; slot -> request holding it
    for step in steps:
        assert 0 < step.num_tokens <= budget and len(step.chunks) <= seqs
        assert len({c.slot for c in step.chunks}) == len(step.chunks), "one chunk per sequence and step"
        decoding = [c.tokens == 1 and c.first >= requests[c.request].prompt for c in step.chunks]
        assert decoding == sorted(decoding, reverse=True), "decode tokens come first"
        assert step.uniform_decode == all(c.tokens == 1 for c in step.chunks)
        for c in step.chunks:
            assert live.setdefault(c.slot, c.request) == c.request, "a slot serves one request at a time"
            assert slot_of.setdefault(c.request, c.slot) == c.slot
            seen[c.request] += range(c.first, c.first + c.tokens)
        for slot in step.freed:
            del live[slot]
    # prompt positions, then one decode position per output token but the first
    for r, request in enumerate(requests):
        assert seen[r] == list(range(request.prompt + request.output - 1)), f"request {r}"
    assert not live, "every slot is free at the end"
    first_step = {}
    for i, step in enumerate(steps):
        for c in step.chunks:
            first_step.setdefault(c.request, i)
    for r in range(len(requests) - 1):  # served in arrival order: admitted no earlier than those before
        assert first_step[r] <= first_step[r + 1] or arrivals[r] > arrivals[r + 1]


def test_the_traces_have_their_shapes():
    decode = S.decode_trace(16, seed=3)
    assert all(step.uniform_decode for step in decode)
    sizes = [step.num_tokens for step in decode]
    assert sizes[0] == 16 and sizes[-1] >= 1 and sizes == sorted(sizes, reverse=True)
    mixed = S.mixed_trace(24, seed=3, token_budget=256, max_seqs=16, max_context=512)
    kinds = collections.Counter(step.kind for step in mixed)
    # it ends with the last prompt chunk
    assert kinds["mixed"] > kinds["decode"] and not mixed[-1].uniform_decode
    assert max(step.num_tokens for step in mixed) == 256
    assert S.mixed_trace(24, seed=3) == S.mixed_trace(24, seed=3) != S.mixed_trace(24, seed=4)
    assert all(r.prompt + r.output <= 512 for r in S.request_mix(200, seed=0, max_context=512))


def test_cache_blocks_are_never_shared_and_come_back():
    model = L.Llama(L.TINY)
    blocks = S.KVBlocks(model, seed=1)
    total = len(blocks.free)
    for step in S.mixed_trace(40, seed=1, token_budget=32, max_seqs=8, max_context=L.TINY.max_context):
        blocks.cover(step)
        owned = [b for slot_blocks in blocks.owned.values() for b in slot_blocks]
        assert len(owned) == len(set(owned)) and 0 not in owned  # block 0 is reserved
        for c in step.chunks:
            assert len(blocks.owned[c.slot]) * L.TINY.block_size >= c.first + c.tokens
            table = model.attn_metadata.block_tables[c.slot, : len(blocks.owned[c.slot])]
            assert table.tolist() == blocks.owned[c.slot]
        blocks.release(step)
    assert len(blocks.free) + sum(map(len, blocks.owned.values())) == total
    with pytest.raises(MemoryError, match="free blocks"):
        S.KVBlocks(model).cover(S.ServingStep((S.Chunk(0, 0, 0, L.TINY.num_blocks * L.TINY.block_size),)))


@pytest.mark.parametrize("compiled", [False, True])
def test_continuous_batching_gives_every_request_what_it_gets_alone(compiled):
    """Each token's hidden state from the batched trace (eager, or compiled by pieceworks) equals the one from
    serving its request alone, prompt in one chunk: chunks, decode tokens, padding rows and blocks change
    nothing."""
    torch.manual_seed(0)
    model = L.Llama(L.TINY)
    requests = S.request_mix(7, seed=2, prompt_median=9, output_median=5, max_context=L.TINY.max_context)
    run = (
        model
        if not compiled
        else pieceworks.compile(
            model,
            pieceworks.CompilationConfig(
                splitting_ops=L.TINY.splitting_ops, compiler="eager", cudagraph_mode="NONE"
            ),
        )
    )

    def serve(steps, fn):
        found, blocks = {}, S.KVBlocks(model, seed=5)
        for step in steps:
            blocks.cover(step)
            out = S.run_step(model, fn, step, "cpu")
            for row, (r, _, p) in enumerate(zip(*step.tokens())):
                found[r, p] = out[row].clone()
            blocks.release(step)
        return found

    batched = serve(S.schedule(requests, token_budget=10, max_seqs=3), run)
    alone = {}
    for r, request in enumerate(requests):
        steps = S.schedule([request], token_budget=L.TINY.max_tokens, max_seqs=1)
        steps = [
            S.ServingStep(tuple(c._replace(request=r) for c in step.chunks), step.freed) for step in steps
        ]
        alone.update(serve(steps, model))
    assert batched.keys() == alone.keys()
    for key in alone:
        torch.testing.assert_close(
            batched[key], alone[key], rtol=1e-4, atol=1e-4, msg=lambda m, key=key: f"{key}: {m}"
        )
