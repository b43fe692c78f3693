"""Triton kernels of paged attention (CUDA): the KV-cache write and two attention kernels, written for this harness
from the published descriptions (FlashAttention's online softmax, vLLM's paged KV layout). Imported only on CUDA.

Layout: q, out [T, heads, D]; k, v [T, kv_heads, D] (each token's kv_heads x D contiguous); caches [num_blocks,
block_size, kv_heads, D] contiguous; block tables [rows, max_blocks] int32. A head group (GQA: heads // kv_heads query
heads sharing one kv head) is computed together, so one program reads each key once for the whole group.
- `write_kv`: one program per token; k and v rows to their cache slot (`slot_mapping`, int64). One launch.
- `token_attention`: one program per (token, kv head), grid fixed by the token count: token t attends to the first
  `lens[t]` positions of block-table row `rows[t]`. With per-token rows and lengths it serves any batch (prefill
  chunks and decode tokens alike) and any CUDA graph; with per-sequence ones it is a decode kernel.
- `chunk_attention`: one program per (sequence, block of its query tokens, kv head), causal within the chunk; the
  grid comes from host values (sequences, longest query), as FlashAttention's varlen API plans it.
Both accumulate in float32 with the online softmax and read keys `BLOCK_N` positions at a time through the block
table; masked positions are never loaded. Not thread-safe only as far as the caller's tensors are shared.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv(k, v, k_cache, v_cache, slot_mapping, stride_k, stride_v, HD: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    slot = tl.load(slot_mapping + t).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    keep = offs < HD
    tl.store(k_cache + slot * HD + offs, tl.load(k + t * stride_k + offs, mask=keep), mask=keep)
    tl.store(v_cache + slot * HD + offs, tl.load(v + t * stride_v + offs, mask=keep), mask=keep)


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    if IEEE:  # float32: exact products (tf32 would round them to 10 bits)
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _attend(acc, m_i, l_i, q, k_cache, v_cache, block_table, h, lo, hi, q_pos, scale,
            KVH: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
    """Online softmax of rows `q` [R, D] over key positions lo..hi-1 of one block table row; position n is visible
    to row r where n <= q_pos[r]."""
    d = tl.arange(0, D)
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        inside = pos < hi
        block = tl.load(block_table + pos // BS, mask=inside, other=0).to(tl.int64)
        where = ((block * BS + pos % BS) * KVH + h) * D
        k = tl.load(k_cache + where[:, None] + d[None, :], mask=inside[:, None], other=0.0)
        v = tl.load(v_cache + where[:, None] + d[None, :], mask=inside[:, None], other=0.0)
        s = _dot(q, tl.trans(k), IEEE) * scale
        s = tl.where(inside[None, :] & (pos[None, :] <= q_pos[:, None]), s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, IEEE)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _token_attention(q, k_cache, v_cache, out, rows, lens, block_tables, stride_qt, stride_qh, stride_ot, stride_oh,
                     stride_b, scale, GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, KVH: tl.constexpr,
                     D: tl.constexpr, BS: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
    t, h = tl.program_id(0), tl.program_id(1)
    row = tl.load(rows + t).to(tl.int64)
    length = tl.load(lens + t)
    g, d = tl.arange(0, GROUP_PAD), tl.arange(0, D)
    head = h * GROUP + g
    qt = tl.load(q + t * stride_qt + head[:, None] * stride_qh + d[None, :], mask=(g < GROUP)[:, None], other=0.0)
    acc = tl.zeros([GROUP_PAD, D], dtype=tl.float32)
    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    last = tl.zeros([GROUP_PAD], dtype=tl.int32) + length - 1
    acc, m_i, l_i = _attend(acc, m_i, l_i, qt, k_cache, v_cache, block_tables + row * stride_b, h, 0, length, last,
                            scale, KVH, D, BS, BLOCK_N, IEEE)
    tl.store(out + t * stride_ot + head[:, None] * stride_oh + d[None, :], (acc / l_i[:, None]).to(out.dtype.element_ty),
             mask=(g < GROUP)[:, None])


@triton.jit
def _chunk_attention(q, k_cache, v_cache, out, query_start, seq_lens, seq_rows, block_tables, stride_qt, stride_qh,
                     stride_ot, stride_oh, stride_b, scale, GROUP: tl.constexpr, GROUP_P2: tl.constexpr,
                     BLOCK_M: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
                     BLOCK_N: tl.constexpr, IEEE: tl.constexpr):
    s, m, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    first = tl.load(query_start + s)
    q_len = tl.load(query_start + s + 1) - first
    if m * BLOCK_M < q_len:
        length, row = tl.load(seq_lens + s), tl.load(seq_rows + s).to(tl.int64)
        r, d = tl.arange(0, BLOCK_M * GROUP_P2), tl.arange(0, D)
        i, g = m * BLOCK_M + r // GROUP_P2, r % GROUP_P2  # row r: query token i of the chunk, head g of the group
        real = (i < q_len) & (g < GROUP)
        where = (first + i).to(tl.int64)
        qt = tl.load(q + where[:, None] * stride_qt + (h * GROUP + g)[:, None] * stride_qh + d[None, :],
                     mask=real[:, None], other=0.0)
        q_pos = length - q_len + i  # the position of query token i: it sees positions <= q_pos
        acc = tl.zeros([BLOCK_M * GROUP_P2, D], dtype=tl.float32)
        m_i = tl.full([BLOCK_M * GROUP_P2], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M * GROUP_P2], dtype=tl.float32)
        hi = length - q_len + tl.minimum((m + 1) * BLOCK_M, q_len)
        acc, m_i, l_i = _attend(acc, m_i, l_i, qt, k_cache, v_cache, block_tables + row * stride_b, h, 0, hi, q_pos,
                                scale, KVH, D, BS, BLOCK_N, IEEE)
        tl.store(out + where[:, None] * stride_ot + (h * GROUP + g)[:, None] * stride_oh + d[None, :],
                 (acc / l_i[:, None]).to(out.dtype.element_ty), mask=real[:, None])


def _rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    """`t` [T, heads, D] with each token's heads x D contiguous (a slice of a wider row is), else a copy."""
    return t if t.stride(2) == 1 and t.stride(1) == t.shape[2] else t.contiguous()


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """k[t], v[t] into cache slot `slot_mapping[t]` for every row t of k (one launch)."""
    k, v = _rows_contiguous(k), _rows_contiguous(v)
    hd = k.shape[1] * k.shape[2]
    _write_kv[(k.shape[0],)](k, v, k_cache, v_cache, slot_mapping, k.stride(0), v.stride(0), hd,
                             triton.next_power_of_2(hd))


def _shape(q: torch.Tensor, k_cache: torch.Tensor) -> dict:
    kvh, d, bs = k_cache.shape[2], k_cache.shape[3], k_cache.shape[1]
    return {"GROUP": q.shape[1] // kvh, "KVH": kvh, "D": d, "BS": bs, "BLOCK_N": max(16, min(64, 4 * bs)),
            "IEEE": q.dtype == torch.float32}


def token_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
                    rows: torch.Tensor, lens: torch.Tensor, block_tables: torch.Tensor, scale: float) -> None:
    """Row t of `out`: attention of q[t] over the first `lens[t]` positions of block-table row `rows[t]`; one launch
    whose grid is fixed by q's row count."""
    shape = _shape(q, k_cache)
    _token_attention[(q.shape[0], shape["KVH"])](
        q, k_cache, v_cache, out, rows, lens, block_tables, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        block_tables.stride(0), scale, GROUP_PAD=max(16, triton.next_power_of_2(shape["GROUP"])), **shape)


def chunk_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
                    query_start: torch.Tensor, seq_lens: torch.Tensor, seq_rows: torch.Tensor,
                    block_tables: torch.Tensor, scale: float, num_seqs: int, max_query_len: int) -> None:
    """Rows query_start[s]..query_start[s+1]-1 of `out`, for s < `num_seqs`: the sequence's last query tokens of its
    `seq_lens[s]` positions, causal; one launch planned on the host (`num_seqs`, `max_query_len`)."""
    shape = _shape(q, k_cache)
    group_p2 = triton.next_power_of_2(shape["GROUP"])
    block_m = max(1, 64 // group_p2)
    _chunk_attention[(num_seqs, triton.cdiv(max_query_len, block_m), shape["KVH"])](
        q, k_cache, v_cache, out, query_start, seq_lens, seq_rows, block_tables, q.stride(0), q.stride(1),
        out.stride(0), out.stride(1), block_tables.stride(0), scale, GROUP_P2=group_p2, BLOCK_M=block_m, **shape)
