"""Paged-KV attention as inference engines run it: a batch's metadata, two attention ops (two graph-support
kinds), Triton kernels on CUDA and the ATen oracle on the CPU.

- The cache: per layer, k and v buffers [num_blocks, block_size, kv_heads, head_dim], written in place only.
  Block 0 is reserved: slot 0 (`ZERO_SLOT`) always holds zeros, slot 1 (`SCRATCH_SLOT`) takes padding rows'
  writes.
- `AttentionMetadata`: static buffers filled in place once per batch by `set_batch` (every layer reads them):
  per token its cache slot, its sequence, how many positions it sees (its position + 1: causal) and where its
  chunk starts; per chunk (a sequence's consecutive positions in the batch, one chunk per sequence) where its
  query tokens start, its length, its first position and its block-table row; the block tables (one row per
  sequence slot; the last row, all zeros, is the padding rows'); and, on the host, the batch's `plan`
  (`num_tokens`, `num_seqs`, `max_query_len`, `uniform_decode`: one query token per sequence).
- The ops read the current metadata (`attention_context`, or the model's, which the batch helpers make
  current), as vLLM's attention reads its forward context. Both write k, v to their slots, then attend (GQA;
  a sliding window and logit soft-capping where the call gives them, as transformers computes them), and
  differ in what a CUDA graph may hold around them (`pieceworks.declare_graph_support`):
  * `llama::paged_attention` (ALWAYS): one kernel per token and kv head, lengths and block tables read from
    the device buffers, grid fixed by the token count: a graph captured for any batch of that size serves
    every batch of it (vLLM's Triton and FlashAttention-3 backends);
  * `llama::paged_attention_varlen` (UNIFORM_DECODE): uniform decode batches run the same kernel over the
    per-sequence buffers; mixed batches run a chunked kernel whose grid is planned on the host (sequences,
    longest query), as FlashAttention's varlen API and FlashInfer's plan do, so no graph may hold a mixed
    batch: captured, it raises.
- On CUDA: one launch per call (attention_kernels.py: each program writes its tokens' k, v and attends; one
  more to zero padding rows of a mixed batch under the varlen op). Elsewhere, or without Triton (warned once):
  `reference_attention`, ATen ops gathering each token's keys, the oracle the kernels are tested against.
Positions that no token of a kernel program may see are never read: a stale or NaN cache never reaches a
real row; padding rows read only the zero slot.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import logging
from typing import Any

import torch
import torch.nn as nn

import pieceworks

__all__ = [
    "ATTENTION_OPS",
    "AttentionMetadata",
    "SCRATCH_SLOT",
    "ZERO_SLOT",
    "attention_context",
    "current",
    "reference_attention",
]

ZERO_SLOT, SCRATCH_SLOT = 0, 1  # both in the reserved block 0
ATTENTION_OPS = {"unified": "llama::paged_attention", "varlen": "llama::paged_attention_varlen"}
log = logging.getLogger("pieceworks")


@dataclasses.dataclass
class HostPlan:
    """The host's plan of the current batch: its tokens, sequences, longest query and whether it is uniform
    decode. Per-call data that no trace reads (the ops read it when they run): a serving record keys it by its
    `uuid()`, the same for every batch, so a warm start with another first batch still serves from the
    record."""

    num_tokens: int = 0
    num_seqs: int = 0
    max_query_len: int = 1
    uniform_decode: bool = True

    def uuid(self) -> str:
        return f"{__name__}.HostPlan"


class AttentionMetadata(nn.Module):
    """The static buffers of one model's batches (see the module doc), for batches of up to
    `config.max_tokens` tokens from `config.max_seqs` sequence slots. Sequence slot s owns blocks `1 + s *
    max_blocks_per_seq + j` where the cache has them (`assign_blocks` gives a slot other blocks, as an
    engine's block manager does)."""

    slot_mapping: torch.Tensor  # the buffers it registers (register_buffer below)
    token_seq: torch.Tensor
    token_lens: torch.Tensor
    token_first: torch.Tensor
    query_start: torch.Tensor
    seq_lens: torch.Tensor
    seq_first: torch.Tensor
    seq_ids: torch.Tensor
    block_tables: torch.Tensor

    def __init__(self, config: Any) -> None:
        super().__init__()
        self.config, rows, seqs = config, config.max_tokens, config.max_seqs
        int32 = torch.int32
        for name, size, fill, dtype in [
            ("slot_mapping", rows, SCRATCH_SLOT, torch.long),
            ("token_seq", rows, seqs, int32),
            ("token_lens", rows, 1, int32),
            ("token_first", rows, 1, int32),
            ("query_start", rows + 1, 0, int32),
            ("seq_lens", rows, 1, int32),
            ("seq_first", rows, 1, int32),
            ("seq_ids", rows, seqs, int32),
        ]:
            self.register_buffer(name, torch.full((size,), fill, dtype=dtype), persistent=False)
        # the host's
        blocks = 1 + torch.arange(seqs * config.max_blocks_per_seq, dtype=torch.int32, device="cpu")
        tables = torch.where(blocks < config.num_blocks, blocks, 0).view(seqs, -1)
        self.host_tables = torch.cat([tables, tables.new_zeros(1, tables.shape[1])])  # the host's copy
        self.register_buffer("block_tables", self.host_tables.to(self.slot_mapping.device), persistent=False)
        # the host's plan of the current batch, written in place (the module's own attributes never change);
        # plain values, so that a serving record can key the model holding it
        self.plan = HostPlan()

    def assign_blocks(self, seq: int, blocks: list[int]) -> None:
        """Sequence slot `seq` owns cache blocks `blocks` (in position order) from now on."""
        self.host_tables[seq, : len(blocks)] = torch.as_tensor(blocks, dtype=torch.int32)
        self.block_tables[seq].copy_(self.host_tables[seq])

    def set_batch(self, seq_ids: torch.Tensor, positions: torch.Tensor) -> None:
        """Token i: position `positions[i]` of sequence slot `seq_ids[i]` (host tensors); a sequence's tokens
        stand next to each other at consecutive positions (its chunk: `ValueError` otherwise). Later rows:
        padding. Host work and one copy per buffer; no device sync."""
        c, n = self.config, len(positions)
        if n > c.max_tokens:
            raise ValueError(
                f"a batch of {n} tokens, but the metadata holds {c.max_tokens} (max_tokens). Fix: split "
                f"the batch, or a config with a larger max_tokens"
            )
        seq_ids, positions = seq_ids.to(torch.int32), positions.to(torch.int32)
        starts = (
            torch.cat(
                [
                    torch.ones(1, dtype=torch.bool),
                    (seq_ids[1:] != seq_ids[:-1]) | (positions[1:] != positions[:-1] + 1),
                ]
            )
            .nonzero()[:, 0]
            .to(torch.int32)
        )
        ends = torch.cat([starts[1:], torch.tensor([n], dtype=torch.int32)])
        if len(set(seq_ids[starts.long()].tolist())) < len(starts):
            raise ValueError(
                "a sequence's tokens must stand next to each other, at consecutive positions: one chunk "
                "per sequence and batch"
            )
        blocks = self.host_tables[seq_ids.long(), (positions // c.block_size).long()].long()
        if not bool(blocks.all()):
            i = int((blocks == 0).nonzero()[0, 0])
            raise ValueError(
                f"sequence slot {int(seq_ids[i])} owns no cache block for position {int(positions[i])} "
                f"(the cache has {c.num_blocks} blocks). Fix: assign_blocks first, or a larger cache"
            )
        firsts, plan = positions[starts.long()], self.plan
        plan.num_tokens, plan.num_seqs, plan.max_query_len = n, len(starts), int((ends - starts).max())
        plan.uniform_decode = plan.max_query_len == 1
        device = self.slot_mapping.device
        for buffer, rows, pad in [
            (self.slot_mapping, blocks * c.block_size + positions % c.block_size, SCRATCH_SLOT),
            (self.token_seq, seq_ids, c.max_seqs),
            (self.token_lens, positions + 1, 1),
            (self.token_first, firsts.repeat_interleave((ends - starts).long()), 1),
            (self.query_start[1:], ends, n),
            (self.seq_lens, positions[(ends - 1).long()] + 1, 1),
            (self.seq_first, firsts, 1),
            (self.seq_ids, seq_ids[starts.long()], c.max_seqs),
        ]:
            buffer[: len(rows)].copy_(rows.to(device, buffer.dtype), non_blocking=True)
            buffer[len(rows) :] = pad


_current: list[AttentionMetadata | None] = [None]  # what the ops read


def current() -> AttentionMetadata | None:
    return _current[0]


@contextlib.contextmanager
def attention_context(metadata: AttentionMetadata):
    """`metadata` is current inside the block (as vLLM's `set_forward_context`), the previous one after it."""
    previous, _current[0] = _current[0], metadata
    try:
        yield metadata
    finally:
        _current[0] = previous


def make_current(metadata: AttentionMetadata) -> None:
    """`metadata` is current from now on (what the batch helpers do after filling a model's metadata)."""
    _current[0] = metadata


def reference_attention(
    q, k, v, k_cache, v_cache, out, scale: float, md: AttentionMetadata, window: int = 0, softcap: float = 0.0
) -> None:
    """The oracle: k, v to their slots (`index_copy_`), then each token's attention over its sequence's first
    `token_lens` positions (the last `window` of them where `window` > 0), gathered through its block-table
    row: scores `scale` q.k, soft-capped to `softcap * tanh(score / softcap)` where `softcap` > 0, softmax in
    float32 (float64 for float64). Reads the longest length on the host: never captured."""
    (n, heads, dim), kv_heads, bs = q.shape, k_cache.shape[2], k_cache.shape[1]
    k_flat, v_flat = k_cache.view(-1, kv_heads, dim), v_cache.view(-1, kv_heads, dim)
    k_flat.index_copy_(0, md.slot_mapping[:n], k)
    v_flat.index_copy_(0, md.slot_mapping[:n], v)
    lens = md.token_lens[:n].long()
    pos = torch.arange(int(lens.max()), device=q.device)
    seen = (pos < lens[:, None]) & ((pos >= lens[:, None] - window) if window > 0 else True)  # [T, L]
    blocks = md.block_tables[md.token_seq[:n].long()][:, pos // bs].long()
    slots = torch.where(seen, blocks * bs + pos % bs, ZERO_SLOT)
    exact = torch.promote_types(q.dtype, torch.float32)
    keys, values = (flat[slots].transpose(1, 2).to(exact) for flat in (k_flat, v_flat))  # [T, kv_heads, L, D]
    grouped = q.view(n, kv_heads, heads // kv_heads, dim).to(exact)  # GQA: heads sharing kv head j
    scores = grouped @ keys.transpose(2, 3) * scale  # [T, kv_heads, group, L]
    if softcap > 0:
        scores = softcap * torch.tanh(scores / softcap)
    weights = scores.masked_fill(~seen[:, None, None], float("-inf")).softmax(-1)
    out.view(grouped.shape).copy_(weights @ values)


# the module the ops launch, imported at their first CUDA call
KERNELS = "pieceworks.harness.models.attention_kernels"
_kernels: list[Any] = []  # that module, once imported (empty: not yet tried; [None]: unavailable)


def _triton_kernels() -> Any:
    if not _kernels:
        try:
            module = importlib.import_module(KERNELS)
        except ImportError as exc:  # a CUDA torch without Triton: the oracle serves, more slowly
            log.warning("paged attention: Triton is not importable (%s); using the ATen implementation", exc)
            module = None
        _kernels.append(module)
    return _kernels[0]


def check_rows(md: AttentionMetadata, rows: int) -> None:
    """`ValueError` where a call of `rows` rows (padding included) has more than `md` holds (max_tokens): the
    kernels read a metadata row per row of q, and must never read past the buffers (an illegal address)."""
    if rows > len(md.slot_mapping):
        raise ValueError(
            f"llama paged attention: {rows} rows, but the metadata holds {len(md.slot_mapping)} "
            f"(max_tokens). Fix: pad batches to at most max_tokens rows"
        )


def _attention(planned: bool, q, k, v, k_cache, v_cache, out, scale: float, *scores: Any) -> None:
    """The ops' one body; `scores`: their window and soft-cap."""
    if (md := _current[0]) is None:
        raise RuntimeError(
            "llama paged attention: no metadata is current (the batch helpers or attention_context set it)"
        )
    check_rows(md, q.shape[0])
    kernels = _triton_kernels() if q.is_cuda else None
    if kernels is None:
        return reference_attention(q, k, v, k_cache, v_cache, out, scale, md, *scores)
    plan = md.plan
    if (
        not planned or plan.uniform_decode
    ):  # per token, or per sequence of one token each: grid fixed by the rows
        rows, lens, firsts = (
            (md.seq_ids, md.seq_lens, md.seq_first)
            if planned
            else (md.token_seq, md.token_lens, md.token_first)
        )
        return kernels.token_attention(
            q,
            k,
            v,
            k_cache,
            v_cache,
            out,
            md.slot_mapping,
            rows,
            lens,
            firsts,
            md.block_tables,
            scale,
            *scores,
        )
    if torch.cuda.is_current_stream_capturing():
        raise RuntimeError(
            "llama::paged_attention_varlen plans a mixed batch on the host (sequences, longest query): "
            "a CUDA graph of it would replay this batch's plan for every batch of its size. Capture it "
            "for uniform decode batches only (it declares GraphSupport.UNIFORM_DECODE)"
        )
    kernels.chunk_attention(
        q,
        k,
        v,
        k_cache,
        v_cache,
        out,
        md.slot_mapping,
        md.query_start,
        md.seq_lens,
        md.seq_ids,
        md.block_tables,
        scale,
        plan.num_seqs,
        plan.max_query_len,
        *scores,
    )
    if q.shape[0] > plan.num_tokens:
        out[plan.num_tokens :].zero_()  # padding rows, as the per-token kernel leaves them


def paged_attention(q, k, v, k_cache, v_cache, out, scale: float, window=0, softcap=0.0) -> None:
    """q, out [T, heads, D]; k, v [T, kv_heads, D]; caches [num_blocks, block_size, kv_heads, D]; a token sees
    the last `window` positions of its sequence where `window` > 0 (a sliding window, as transformers' masks
    draw it), scores soft-capped at `softcap` where > 0 (Gemma 2's); see the module."""
    _attention(False, q, k, v, k_cache, v_cache, out, scale, window, softcap)


def paged_attention_varlen(q, k, v, k_cache, v_cache, out, scale: float, window=0, softcap=0.0) -> None:
    """As `paged_attention`, mixed batches planned on the host; see the module doc."""
    _attention(True, q, k, v, k_cache, v_cache, out, scale, window, softcap)


_lib = torch.library.Library("llama", "FRAGMENT")  # not @custom_op: tens of µs less per eager call
for _impl in (paged_attention, paged_attention_varlen):
    _lib.define(
        f"{_impl.__name__}(Tensor q, Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, "
        "Tensor(c!) out, float scale, int window=0, float softcap=0.0) -> ()"
    )
    _lib.impl(_impl.__name__, _impl, "CompositeExplicitAutograd")
    # writes only its mutable arguments
    torch.library.register_fake(f"llama::{_impl.__name__}")(lambda *args, **kwargs: None)
pieceworks.declare_graph_support(ATTENTION_OPS["unified"], pieceworks.GraphSupport.ALWAYS)
pieceworks.declare_graph_support(ATTENTION_OPS["varlen"], pieceworks.GraphSupport.UNIFORM_DECODE)
