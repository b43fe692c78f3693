"""Triton kernels of paged attention (CUDA), written for this harness from the published descriptions
(FlashAttention's online softmax, vLLM's paged KV layout). Imported only on CUDA. One launch per call: each
program writes its tokens' k and v to the cache and attends.

Layout: q, out [T, heads, D]; k, v [T, kv_heads, D] (each token's kv_heads x D contiguous); caches
[num_blocks, block_size, kv_heads, D] contiguous; block tables [rows, max_blocks] int32. A head group (GQA:
heads // kv_heads query heads sharing one kv head) is computed together, so one program reads each key once
for the whole group. A token sees the positions before its chunk (the batch's consecutive tokens of its
sequence) in the cache, written by earlier batches, and its chunk's positions up to its own in the batch's k,
v rows: no program reads a slot another program of the same launch writes.
- `token_attention`: one program per (token, kv head), grid fixed by the token count: token t attends to the
  first `lens[t]` positions of block-table row `rows[t]`, of which those from `firsts[t]` on are its chunk's.
  With per-token rows and lengths it serves any batch and any CUDA graph; over the per-sequence ones of a
  uniform decode batch (a sequence per row) it is a decode kernel.
- `chunk_attention`: one program per (sequence, block of its query tokens, kv head), causal within the chunk;
  the grid comes from host values (sequences, longest query), as FlashAttention's varlen API plans it.
Both accumulate in float32 with the online softmax, reading `BLOCK_N` positions at a time; positions past a
token's own are never loaded, nor, under a sliding window (`WINDOW`), those before the window of the first
query token a program computes. `WINDOW` and `SOFTCAP` (logit soft-capping) are compile-time constants: a
model compiles one kernel per kind of layer. `_Launcher` launches compiled kernels without the JIT's
per-argument work after their first launch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import triton
import triton.language as tl
from triton.runtime import driver

try:
    from triton import knobs  # Triton >= 3.4: where launch hooks live
except ImportError:  # older Triton: every launch goes through the JIT
    knobs = None


# fmt: off
# The Triton kernels keep their dense parameter lists and calls: the formatter's one parameter a line would
# more than double them and bury the arithmetic.
@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    if IEEE:  # float32: exact products (tf32 would round them to 10 bits)
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a, b)


@triton.jit
def _attend(acc, m_i, l_i, q, k_cache, v_cache, k, v, block_table, h, lo, hi, first, first_row, q_pos, scale,
            stride_kt: tl.constexpr, stride_vt: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr,
            BS: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr, WINDOW: tl.constexpr,
            SOFTCAP: tl.constexpr):
    """Online softmax of rows `q` [R, D] over positions lo..hi-1: those below `first` from the cache through
    `block_table`, the others from rows `first_row + (position - first)` of k, v; row r sees the positions up
    to q_pos[r], and (WINDOW > 0) none WINDOW or more before it; scores capped at SOFTCAP (> 0) by
    SOFTCAP * tanh(score / SOFTCAP)."""
    d = tl.arange(0, D)
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        cached, new = (pos < hi) & (pos < first), (pos < hi) & (pos >= first)
        block = tl.load(block_table + pos // BS, mask=cached, other=0).to(tl.int64)
        where = ((block * BS + pos % BS) * KVH + h) * D
        row = (first_row + pos - first).to(tl.int64)
        kt = tl.load(k_cache + where[:, None] + d[None, :], mask=cached[:, None], other=0.0) + tl.load(
            k + row[:, None] * stride_kt + h * D + d[None, :], mask=new[:, None], other=0.0)
        vt = tl.load(v_cache + where[:, None] + d[None, :], mask=cached[:, None], other=0.0) + tl.load(
            v + row[:, None] * stride_vt + h * D + d[None, :], mask=new[:, None], other=0.0)
        s = _dot(q, tl.trans(kt), IEEE) * scale
        if SOFTCAP > 0:  # tanh(x) = 2 sigmoid(2x) - 1
            s = SOFTCAP * (2 * tl.sigmoid(s * (2 / SOFTCAP)) - 1)
        seen = (pos < hi)[None, :] & (pos[None, :] <= q_pos[:, None])
        if WINDOW > 0:
            seen = seen & (pos[None, :] > q_pos[:, None] - WINDOW)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing yet
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + _dot(p.to(vt.dtype), vt, IEEE)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _write(k, v, k_cache, v_cache, slot_mapping, tokens, mask, h, stride_kt: tl.constexpr,
           stride_vt: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr):
    """k, v of kv head h of rows `tokens` (where `mask`) to their cache slots."""
    d = tl.arange(0, D)
    slot = tl.load(slot_mapping + tokens, mask=mask, other=0)
    where = (slot * KVH + h) * D
    tl.store(k_cache + where[:, None] + d[None, :],
             tl.load(k + tokens[:, None] * stride_kt + h * D + d[None, :], mask=mask[:, None]),
             mask=mask[:, None])
    tl.store(v_cache + where[:, None] + d[None, :],
             tl.load(v + tokens[:, None] * stride_vt + h * D + d[None, :], mask=mask[:, None]),
             mask=mask[:, None])


@triton.jit
def _token_attention(q, k, v, k_cache, v_cache, out, slot_mapping, rows, lens, firsts, block_tables, scale,
                     stride_qt: tl.constexpr, stride_qh: tl.constexpr, stride_kt: tl.constexpr,
                     stride_vt: tl.constexpr, stride_ot: tl.constexpr, stride_oh: tl.constexpr,
                     stride_b: tl.constexpr, GROUP: tl.constexpr, KVH: tl.constexpr, D: tl.constexpr,
                     BS: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr, WINDOW: tl.constexpr,
                     SOFTCAP: tl.constexpr, GROUP_PAD: tl.constexpr):
    t, h = tl.program_id(0), tl.program_id(1)
    _write(k, v, k_cache, v_cache, slot_mapping, t + tl.arange(0, 1), tl.full([1], 1, tl.int1), h, stride_kt,
           stride_vt, KVH, D)
    row = tl.load(rows + t).to(tl.int64)
    length = tl.load(lens + t)
    first = tl.load(firsts + t)
    g, d = tl.arange(0, GROUP_PAD), tl.arange(0, D)
    head = h * GROUP + g
    qt = tl.load(q + t * stride_qt + head[:, None] * stride_qh + d[None, :], mask=(g < GROUP)[:, None],
                 other=0.0)
    acc = tl.zeros([GROUP_PAD, D], dtype=tl.float32)
    m_i = tl.full([GROUP_PAD], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP_PAD], dtype=tl.float32)
    last = tl.zeros([GROUP_PAD], dtype=tl.int32) + length - 1
    lo = 0
    if WINDOW > 0:
        lo = tl.maximum(length - WINDOW, 0)
    acc, m_i, l_i = _attend(acc, m_i, l_i, qt, k_cache, v_cache, k, v, block_tables + row * stride_b, h, lo,
                            length, first, t - (length - 1 - first), last, scale, stride_kt, stride_vt, KVH,
                            D, BS, BLOCK_N, IEEE, WINDOW, SOFTCAP)
    tl.store(out + t * stride_ot + head[:, None] * stride_oh + d[None, :],
             (acc / l_i[:, None]).to(out.dtype.element_ty), mask=(g < GROUP)[:, None])


@triton.jit
def _chunk_attention(q, k, v, k_cache, v_cache, out, slot_mapping, query_start, seq_lens, seq_rows,
                     block_tables, scale, stride_qt: tl.constexpr, stride_qh: tl.constexpr,
                     stride_kt: tl.constexpr, stride_vt: tl.constexpr, stride_ot: tl.constexpr,
                     stride_oh: tl.constexpr, stride_b: tl.constexpr, GROUP: tl.constexpr, KVH: tl.constexpr,
                     D: tl.constexpr, BS: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
                     WINDOW: tl.constexpr, SOFTCAP: tl.constexpr, GROUP_P2: tl.constexpr,
                     BLOCK_M: tl.constexpr):
    s, m, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    first_row = tl.load(query_start + s)
    q_len = tl.load(query_start + s + 1) - first_row
    if m * BLOCK_M < q_len:
        tokens = m * BLOCK_M + tl.arange(0, BLOCK_M)
        _write(k, v, k_cache, v_cache, slot_mapping, first_row + tokens, tokens < q_len, h, stride_kt,
               stride_vt, KVH, D)
        length, row = tl.load(seq_lens + s), tl.load(seq_rows + s).to(tl.int64)
        r, d = tl.arange(0, BLOCK_M * GROUP_P2), tl.arange(0, D)
        # row r: query token i of the chunk, head g of the group
        i, g = m * BLOCK_M + r // GROUP_P2, r % GROUP_P2
        real = (i < q_len) & (g < GROUP)
        where = (first_row + i).to(tl.int64)
        qt = tl.load(q + where[:, None] * stride_qt + (h * GROUP + g)[:, None] * stride_qh + d[None, :],
                     mask=real[:, None], other=0.0)
        first = length - q_len
        acc = tl.zeros([BLOCK_M * GROUP_P2, D], dtype=tl.float32)
        m_i = tl.full([BLOCK_M * GROUP_P2], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M * GROUP_P2], dtype=tl.float32)
        lo = 0
        if WINDOW > 0:  # the window of the block's first query token
            lo = tl.maximum(first + m * BLOCK_M - WINDOW + 1, 0)
        acc, m_i, l_i = _attend(acc, m_i, l_i, qt, k_cache, v_cache, k, v, block_tables + row * stride_b, h,
                                lo, first + tl.minimum((m + 1) * BLOCK_M, q_len), first, first_row, first + i,
                                scale, stride_kt, stride_vt, KVH, D, BS, BLOCK_N, IEEE, WINDOW, SOFTCAP)
        tl.store(out + where[:, None] * stride_ot + (h * GROUP + g)[:, None] * stride_oh + d[None, :],
                 (acc / l_i[:, None]).to(out.dtype.element_ty), mask=real[:, None])
# fmt: on


class _Launcher:
    """Launches of one Triton kernel. The first launch for a key (everything the compiled code depends on
    besides the pointers: dtypes, strides, shapes) goes through the JIT, which specializes every argument
    (microseconds per argument) and compiles; later ones call the compiled binary with the same constants,
    after one check that every pointer is 16-byte aligned as the JIT assumed (else the JIT serves the call).
    Strides are compile-time constants: one compile per model shape. With a launch hook installed (a
    profiler's), every launch goes through the JIT."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel
        self.compiled: dict[tuple, tuple[Any, tuple]] = {}  # by key: (compiled kernel, constants' values)

    def __call__(
        self, key: tuple, grid: tuple, pointers: tuple, scalars: tuple, constants: Callable[[], dict]
    ) -> None:
        key = (key, *(p.dtype for p in pointers))
        found, aligned = self.compiled.get(key), not any(p.data_ptr() & 15 for p in pointers)
        hook = None if knobs is None else knobs.runtime.launch_enter_hook  # an empty HookChain calls nothing
        hooked = knobs is None or (hook is not None and bool(getattr(hook, "calls", True)))
        if found is None or not aligned or hooked:
            named = constants()
            compiled = self.kernel[grid](*pointers, *scalars, **named)
            if found is None and aligned and compiled is not None:  # None: Triton's interpreter
                assert list(self.kernel.arg_names[-len(named) :]) == list(named), (
                    "constants out of signature order"
                )
                self.compiled[key] = (compiled, tuple(named.values()))
            return
        compiled, values = found
        compiled.run(
            *grid,
            *(1,) * (3 - len(grid)),
            driver.active.get_current_stream(pointers[0].device.index),
            compiled.function,
            compiled.packed_metadata,
            None,
            None,
            None,
            *pointers,
            *scalars,
            *values,
        )


_launch_token, _launch_chunk = _Launcher(_token_attention), _Launcher(_chunk_attention)


def _rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    """`t` [T, heads, D] with each token's heads x D contiguous (a slice of a wider row is), else a copy."""
    return t if t.stride(2) == 1 and t.stride(1) == t.shape[2] else t.contiguous()


def _layout(q, k, v, k_cache, out, block_tables) -> tuple:
    """What the compiled code depends on of the tensors' layout (`_Launcher`'s key)."""
    return (q.stride(), k.stride(0), v.stride(0), out.stride(), k_cache.shape, block_tables.stride(0))


def _constants(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    out: torch.Tensor,
    block_tables: torch.Tensor,
    window: int,
    softcap: float,
) -> dict:
    kvh, d, bs = k_cache.shape[2], k_cache.shape[3], k_cache.shape[1]
    return {
        "stride_qt": q.stride(0),
        "stride_qh": q.stride(1),
        "stride_kt": k.stride(0),
        "stride_vt": v.stride(0),
        "stride_ot": out.stride(0),
        "stride_oh": out.stride(1),
        "stride_b": block_tables.stride(0),
        "GROUP": q.shape[1] // kvh,
        "KVH": kvh,
        "D": d,
        "BS": bs,
        "BLOCK_N": max(16, min(64, 4 * bs)),
        "IEEE": q.dtype == torch.float32,
        "WINDOW": window,
        "SOFTCAP": float(softcap),
    }


def token_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    slot_mapping: torch.Tensor,
    rows: torch.Tensor,
    lens: torch.Tensor,
    firsts: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> None:
    """k[t], v[t] to cache slot `slot_mapping[t]`, and row t of `out`: attention of q[t] over the first
    `lens[t]` positions of block-table row `rows[t]` (the last `window` of them where `window` > 0, scores
    soft-capped at `softcap` where > 0), those from `firsts[t]` on being its chunk's; one launch whose grid is
    fixed by q's row count."""
    k, v = _rows_contiguous(k), _rows_contiguous(v)

    def constants() -> dict:
        found = _constants(q, k, v, k_cache, out, block_tables, window, softcap)
        return {**found, "GROUP_PAD": max(16, triton.next_power_of_2(found["GROUP"]))}

    _launch_token(
        (_layout(q, k, v, k_cache, out, block_tables), window, softcap),
        (q.shape[0], k_cache.shape[2]),
        (q, k, v, k_cache, v_cache, out, slot_mapping, rows, lens, firsts, block_tables),
        (scale,),
        constants,
    )


def chunk_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    slot_mapping: torch.Tensor,
    query_start: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_rows: torch.Tensor,
    block_tables: torch.Tensor,
    scale: float,
    num_seqs: int,
    max_query_len: int,
    window: int = 0,
    softcap: float = 0.0,
) -> None:
    """For s < `num_seqs`, rows query_start[s]..query_start[s+1]-1: k, v to their cache slots, and their
    attention, the sequence's last query tokens of its `seq_lens[s]` positions, causal (windowed and
    soft-capped as `token_attention`); one launch planned on the host (`num_seqs`, `max_query_len`)."""
    k, v = _rows_contiguous(k), _rows_contiguous(v)
    group_p2 = triton.next_power_of_2(q.shape[1] // k_cache.shape[2])
    block_m = max(1, 64 // group_p2)
    _launch_chunk(
        (_layout(q, k, v, k_cache, out, block_tables), window, softcap),
        (num_seqs, triton.cdiv(max_query_len, block_m), k_cache.shape[2]),
        (q, k, v, k_cache, v_cache, out, slot_mapping, query_start, seq_lens, seq_rows, block_tables),
        (scale,),
        lambda: {
            **_constants(q, k, v, k_cache, out, block_tables, window, softcap),
            "GROUP_P2": group_p2,
            "BLOCK_M": block_m,
        },
    )
