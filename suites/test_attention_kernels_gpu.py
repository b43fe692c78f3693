"""The Triton paged-attention kernels (harness/models/attention_kernels.py, through the two ops) against the
ATen oracle in float64, on random batches: decode tokens and prefill chunks of random lengths, scattered block
tables, GQA ratios, head dims 64 and 128, padding rows, sliding windows, logit soft-capping, bf16 / fp16 /
fp32; and what a CUDA graph may hold around each op."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pieceworks.harness.models import paged_attention as P
from pieceworks.harness.models.llama import LlamaConfig

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]
TOLERANCE = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.5e-2}  # ‖out - ref‖ / ‖ref‖


@st.composite
def batches(draw, mixed: bool = True):
    """(config, sequences [(slot, context before, query tokens)], padding rows, dtype, op, seed)."""
    heads, kv_heads = draw(st.sampled_from([(8, 8), (8, 2), (16, 2)]))  # GQA groups of 1, 4 and 8
    config = LlamaConfig(
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=draw(st.sampled_from([64, 128])),
        max_blocks_per_seq=12,
        max_tokens=160,
        max_seqs=12,
    )
    slots = draw(st.lists(st.integers(0, config.max_seqs - 1), min_size=1, max_size=8, unique=True))
    sequences, room = [], config.max_tokens  # rows, padding included, that the metadata holds
    for slot in slots[:room]:
        query = (
            draw(st.integers(1, min(40, room - (len(slots) - len(sequences) - 1))))
            if mixed and draw(st.booleans())
            else 1
        )
        sequences.append((slot, draw(st.integers(0, config.max_context - query)), query))
        room -= query
    return (
        config,
        sequences,
        draw(st.integers(0, min(9, room))),
        draw(st.sampled_from(list(TOLERANCE))),
        draw(st.sampled_from(list(P.ATTENTION_OPS.values()))),
        draw(st.integers(0, 2**16)),
    )


def _metadata(config: LlamaConfig, seed: int, device) -> P.AttentionMetadata:
    """Metadata whose block tables scatter each sequence slot's blocks over the cache."""
    md = P.AttentionMetadata(config).to(device)
    scattered = torch.randperm(config.num_blocks - 1, generator=torch.Generator().manual_seed(seed)) + 1
    for slot, blocks in enumerate(scattered.view(config.max_seqs, -1).tolist()):
        md.assign_blocks(slot, blocks)
    return md


def _caches(config: LlamaConfig, dtype, device) -> list[torch.Tensor]:
    """k and v caches of NaN (block 0 aside: zeros): a read of any position a token may not see is a NaN
    row."""
    caches = [
        torch.full(
            (config.num_blocks, config.block_size, config.num_kv_heads, config.head_dim),
            float("nan"),
            dtype=dtype,
            device=device,
        )
        for _ in "kv"
    ]
    for cache in caches:
        cache[0] = 0
    return caches


def _batch(md, caches, sequences, padding: int, seed: int) -> list[torch.Tensor]:
    """Random keys and values at every position before each sequence's query tokens, the batch's metadata, and
    its q, k, v (`padding` rows more)."""
    c, gen = md.config, torch.Generator().manual_seed(seed)
    for cache in caches:
        flat = cache.view(-1, c.num_kv_heads, c.head_dim)
        for slot, before, _ in sequences:
            blocks = md.host_tables[slot, torch.arange(before) // c.block_size].long()
            flat[(blocks * c.block_size + torch.arange(before) % c.block_size).to(cache.device)] = (
                torch.randn(before, c.num_kv_heads, c.head_dim, generator=gen).to(cache.device, cache.dtype)
            )
    md.set_batch(
        torch.tensor([s for s, _, n in sequences for _ in range(n)]),
        torch.cat([torch.arange(before, before + n) for _, before, n in sequences]),
    )
    rows = md.plan.num_tokens + padding
    return [
        torch.randn(rows, h, c.head_dim, generator=gen).to(caches[0].device, caches[0].dtype)
        for h in (c.num_heads, c.num_kv_heads, c.num_kv_heads)
    ]


def _run(op: str, md, q, k, v, caches, out, window: int = 0, softcap: float = 0.0) -> None:
    with P.attention_context(md):
        getattr(torch.ops.llama, op.split("::")[1])(
            q, k, v, *caches, out, q.shape[-1] ** -0.5, window, softcap
        )


def _oracle(md, q, k, v, caches, window: int = 0, softcap: float = 0.0):
    """The oracle's output and caches, in float64, on copies."""
    expected_caches = [c.double() for c in caches]
    expected = torch.full(q.shape, float("nan"), dtype=torch.float64, device=q.device)
    P.reference_attention(
        q.double(),
        k.double(),
        v.double(),
        *expected_caches,
        expected,
        q.shape[-1] ** -0.5,
        md,
        window,
        softcap,
    )
    return expected, expected_caches


def _relative_error(got: torch.Tensor, expected: torch.Tensor) -> float:
    return float((got.double() - expected).norm() / expected.norm())


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(
    batch=batches(), window=st.sampled_from([0, 0, 1, 5, 16, 37]), softcap=st.sampled_from([0.0, 0.0, 1.0])
)
def test_kernels_match_the_oracle_on_random_batches(cuda, batch, window, softcap):
    """Sliding windows (0: none) and logit soft-capping (0: none) included."""
    config, sequences, padding, dtype, op, seed = batch
    md, caches = _metadata(config, seed, cuda), _caches(config, dtype, cuda)
    q, k, v = _batch(md, caches, sequences, padding, seed)
    with torch.no_grad():
        expected, expected_caches = _oracle(md, q, k, v, caches, window, softcap)
        out = torch.full_like(q, float("nan"))  # poisoned: every row must be written
        _run(op, md, q, k, v, caches, out, window, softcap)
    torch.cuda.synchronize()
    real = md.plan.num_tokens
    error = _relative_error(out[:real], expected[:real])
    assert error < TOLERANCE[dtype], (
        f"{op} {dtype} window {window} softcap {softcap}: relative error {error:.2e}"
    )
    assert not out.isnan().any(), (
        f"{op}: NaN in rows {out.isnan().flatten(1).any(1).nonzero()[:, 0].tolist()}"
    )
    assert out[real:].eq(0).all(), f"{op}: padding rows must read the zero slot alone"
    for got, want in zip(
        caches, expected_caches
    ):  # the same slots written, with the same values, nothing else
        got, want = got.double().view(-1, *got.shape[2:]), want.view(-1, *want.shape[2:])
        got[P.SCRATCH_SLOT] = want[P.SCRATCH_SLOT] = 0  # padding rows' writes: any one of them may land last
        assert torch.equal(got.isnan(), want.isnan())
        assert torch.equal(got.nan_to_num(), want.nan_to_num())


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.function_scoped_fixture,
    ],
)
@given(first=batches(), second=batches())
def test_a_unified_graph_replays_any_batch_of_its_size(cuda, first, second):
    """A CUDA graph of `llama::paged_attention` captured for one batch serves another of the same row count (a
    chunk, or decode tokens): everything it launches reads the metadata buffers, refilled in place."""
    config, sequences, padding, dtype, _, seed = first
    md, caches = _metadata(config, seed, cuda), _caches(config, dtype, cuda)
    q, k, v = _batch(md, caches, sequences, padding, seed)
    rows, unified = q.shape[0], P.ATTENTION_OPS["unified"]
    slot, before, _ = second[1][0]
    other = (
        [(slot, min(before, config.max_context - rows), rows)]
        if second[2] % 2
        else [(s, b, 1) for s, b, _ in second[1]][:rows]
    )  # a chunk of `rows` tokens, or decode tokens and padding
    out = torch.empty_like(q)
    with torch.no_grad():
        _run(unified, md, q, k, v, caches, out)  # warm-up: kernels compiled
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            _run(unified, md, q, k, v, caches, out)
        for mine, theirs in zip(
            (q, k, v), _batch(md, caches, other, rows - sum(n for *_, n in other), seed + 1)
        ):
            mine.copy_(theirs)
        expected, _ = _oracle(md, q, k, v, caches)
        graph.replay()
    torch.cuda.synchronize()
    real = md.plan.num_tokens
    assert _relative_error(out[:real], expected[:real]) < TOLERANCE[dtype]
    assert out[real:].eq(0).all()


def test_the_varlen_op_refuses_a_graph_of_a_mixed_batch_and_takes_one_of_a_decode_batch(cuda):
    config = LlamaConfig(
        num_heads=8, num_kv_heads=2, head_dim=64, max_blocks_per_seq=4, max_tokens=16, max_seqs=8
    )
    md, caches = _metadata(config, 0, cuda), _caches(config, torch.bfloat16, cuda)
    q, k, v = _batch(md, caches, [(1, 5, 4), (3, 0, 1)], 0, 0)
    out, varlen = torch.empty_like(q), P.ATTENTION_OPS["varlen"]
    with torch.no_grad():
        _run(varlen, md, q, k, v, caches, out)  # eager: served
        with pytest.raises(RuntimeError, match="plans a mixed batch on the host"):
            with torch.cuda.graph(torch.cuda.CUDAGraph()):
                _run(varlen, md, q, k, v, caches, out)
        q, k, v = _batch(md, caches, [(1, 5, 1), (3, 0, 1), (6, 9, 1)], 2, 1)
        out = torch.full_like(q, float("nan"))
        expected, _ = _oracle(md, q, k, v, caches)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):  # one token per sequence: the decode kernel, grid fixed by the rows
            _run(varlen, md, q, k, v, caches, out)
        graph.replay()
    torch.cuda.synchronize()
    assert _relative_error(out[:3], expected[:3]) < TOLERANCE[torch.bfloat16]
    assert out[3:].eq(0).all()
