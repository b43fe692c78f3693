"""A Llama-shaped model (random weights, no download) whose splitting op is a real paged-KV attention.

- Presets: `LLAMA_1B` (Llama-3.2-1B), `LLAMA_8B` (Llama-3.1-8B, 32 layers; `dataclasses.replace(LLAMA_8B,
  num_layers=4)` for a quick slice), `TINY` (CPU tests); RoPE without Llama 3.1's long-context scaling (other
  values, same cost). No lm_head: `forward(input_ids [B], positions [B])` returns the final-normed hidden
  states [B, hidden].
- Attention: paged_attention.py (the ops, the metadata, the kernels). `LlamaConfig.attention` picks the op,
  and `LlamaConfig.splitting_ops` names it. Metadata reaches the op as vLLM's forward context does: the op
  reads the current `AttentionMetadata`, set by `with attention_context(md):` or by `serve_tokens` /
  `decode_batch` / `prefill_batch`, which fill the model's own (`Llama.attn_metadata`) and leave it current: a
  driver then only calls `model(*args)`.
- Tensor parallel: `shard(model, group)` keeps this rank's share of every layer (attention heads and MLP
  columns, Megatron-style), a functional all-reduce after each layer's attention output and MLP: every rank
  returns the whole model's output. The all-reduces are plain graph ops (captured inside pieces) unless listed
  as splitting ops.
- Capture-safe on CUDA: no host sync, no data-dependent shape, fixed addresses: a FULL graph reads the
  metadata buffers at its capture, so refill those in place (the helpers refill the model's own).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
import torch.nn.functional as F

from .paged_attention import (
    ATTENTION_OPS,
    SCRATCH_SLOT,
    ZERO_SLOT,
    AttentionMetadata,
    attention_context,
    make_current,
)

if TYPE_CHECKING:  # hf_llama imports this module
    from .hf_llama import PagedModel

__all__ = [
    "LlamaConfig",
    "LLAMA_1B",
    "LLAMA_8B",
    "TINY",
    "SPLITTING_OPS",
    "AttentionMetadata",
    "Llama",
    "attention_context",
    "serve_tokens",
    "decode_batch",
    "prefill_batch",
    "shard",
    "ALL_REDUCE",
    "SCRATCH_SLOT",
    "ZERO_SLOT",
]

# the default attention's; `LlamaConfig.splitting_ops` names any config's
SPLITTING_OPS = [ATTENTION_OPS["unified"]]
# The tensor-parallel all-reduce and its wait, to list as splitting ops or not: both or neither (a wait left
# in the next piece is consumed by that piece's warm-up, and its CUDA graph would read the sum before NCCL
# writes it).
ALL_REDUCE = ["_c10d_functional::all_reduce", "_c10d_functional::wait_tensor"]


@dataclasses.dataclass(frozen=True)
class LlamaConfig:
    """Model shape, then batches and the KV cache: `max_tokens` is the largest batch, `max_seqs` the sequence
    slots, `max_blocks_per_seq` blocks of `block_size` positions the longest sequence, `cache_blocks` the
    cache's blocks (default: enough for every slot's longest sequence, plus the reserved block). `attention`:
    "unified" or "varlen" (paged_attention.py: what a CUDA graph may hold around it)."""

    num_layers: int = 16
    hidden_size: int = 2048
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 64
    intermediate_size: int = 8192
    vocab_size: int = 128256
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    block_size: int = 16
    max_blocks_per_seq: int = 16
    max_tokens: int = 512
    max_seqs: int = 512
    cache_blocks: int | None = None
    attention: str = "unified"
    num_blocks = property(lambda self: self.cache_blocks or 1 + self.max_seqs * self.max_blocks_per_seq)
    max_context = property(lambda self: self.block_size * self.max_blocks_per_seq)  # positions per sequence
    splitting_ops = property(lambda self: [ATTENTION_OPS[self.attention]])


LLAMA_1B = LlamaConfig()
LLAMA_8B = LlamaConfig(num_layers=32, hidden_size=4096, head_dim=128, intermediate_size=14336)
TINY = LlamaConfig(
    num_layers=2,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=256,
    block_size=4,
    max_blocks_per_seq=8,
    max_tokens=64,
    max_seqs=64,
)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * weight


class Block(nn.Module):
    """Pre-norm decoder layer: fused-qkv GQA attention through its paged cache, then a SwiGLU MLP (fused
    gate/up)."""

    k_cache: torch.Tensor  # buffers (register_buffer)
    v_cache: torch.Tensor

    def __init__(self, c: LlamaConfig) -> None:
        super().__init__()
        self.c, kv_shape = c, (c.num_blocks, c.block_size, c.num_kv_heads, c.head_dim)
        self.attention_norm, self.ffn_norm = (nn.Parameter(torch.ones(c.hidden_size)) for _ in range(2))
        self.wqkv = nn.Linear(c.hidden_size, (c.num_heads + 2 * c.num_kv_heads) * c.head_dim, bias=False)
        self.wo = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)
        self.w13 = nn.Linear(c.hidden_size, 2 * c.intermediate_size, bias=False)
        self.w2 = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)
        self.register_buffer("k_cache", torch.zeros(kv_shape), persistent=False)
        self.register_buffer("v_cache", torch.zeros(kv_shape), persistent=False)
        self.group: dist.ProcessGroup | None = None  # tensor parallel over this group (`shard`)

    def reduced(self, t: torch.Tensor) -> torch.Tensor:
        return t if self.group is None else funcol.all_reduce(t, "sum", self.group)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        c, heads = self.c, self.c.num_heads + self.c.num_kv_heads
        qkv = self.wqkv(rms_norm(x, self.attention_norm, c.norm_eps)).view(
            -1, heads + c.num_kv_heads, c.head_dim
        )
        x1, x2 = qkv[:, :heads].chunk(2, dim=-1)  # RoPE on q and k, rotate-half layout (Hugging Face's Llama)
        qk = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).type_as(x)
        q, k, out = (
            qk[:, : c.num_heads],
            qk[:, c.num_heads :],
            qk.new_empty(qk.shape[0], c.num_heads, c.head_dim),
        )
        attention = (
            torch.ops.llama.paged_attention_varlen
            if c.attention == "varlen"
            else torch.ops.llama.paged_attention
        )
        attention(q, k, qkv[:, heads:], self.k_cache, self.v_cache, out, c.head_dim**-0.5)
        h = x + self.reduced(self.wo(out.flatten(1)))
        gate, up = self.w13(rms_norm(h, self.ffn_norm, c.norm_eps)).chunk(2, dim=-1)
        return h + self.reduced(self.w2(F.silu(gate) * up))


class Llama(nn.Module):
    """Embedding, blocks, final RMSNorm; weights N(0, 0.02). L layers split into 2L+1 pieces, L+1 compiled."""

    def __init__(self, config: LlamaConfig = TINY) -> None:
        super().__init__()
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.norm = nn.Parameter(torch.ones(config.hidden_size))
        self.attn_metadata = AttentionMetadata(config)
        for weight in [m.weight for m in self.modules() if isinstance(m, (nn.Linear, nn.Embedding))]:
            nn.init.normal_(weight, std=0.02)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        d = self.config.head_dim
        inv_freq = self.config.rope_theta ** (
            -torch.arange(0, d, 2, device=positions.device, dtype=torch.float32) / d
        )
        freqs = (positions[:, None].float() * inv_freq)[:, None]  # [T, 1, D/2]
        x, cos, sin = self.tok_embeddings(input_ids), freqs.cos(), freqs.sin()
        for layer in self.layers:
            x = layer(x, cos, sin)
        return rms_norm(x, self.norm, self.config.norm_eps)


def shard(model: Llama, group: dist.ProcessGroup | None = None) -> Llama:
    """`model` (every rank built it alike: same seed) made this rank's tensor-parallel share over `group`
    (default: the world), in place: q, k, v heads, wo's input columns, gate and up rows, w2's input columns
    and the KV cache's heads split in rank order. Heads and the MLP width must divide by the group's size."""
    group = group or dist.group.WORLD
    rank, size = dist.get_rank(group), dist.get_world_size(group)
    for block in model.layers:
        assert isinstance(block, Block)  # Llama's layers
        c, d = block.c, block.c.head_dim
        if c.num_kv_heads % size or c.intermediate_size % size:
            raise ValueError(
                f"{c.num_kv_heads} kv heads, MLP width {c.intermediate_size}: not divisible by {size}"
            )
        q, k, v = block.wqkv.weight.detach().split([c.num_heads * d, c.num_kv_heads * d, c.num_kv_heads * d])

        def mine(w: torch.Tensor, dim: int = 0) -> torch.Tensor:
            return w.detach().chunk(size, dim)[rank].contiguous()

        block.wqkv.weight = nn.Parameter(torch.cat([mine(q), mine(k), mine(v)]))
        block.w13.weight = nn.Parameter(torch.cat([mine(w) for w in block.w13.weight.chunk(2)]))
        block.wo.weight, block.w2.weight = (nn.Parameter(mine(w.weight, 1)) for w in (block.wo, block.w2))
        block.k_cache, block.v_cache = mine(block.k_cache, 2), mine(block.v_cache, 2)
        block.c, block.group = (
            dataclasses.replace(
                c,
                num_heads=c.num_heads // size,
                num_kv_heads=c.num_kv_heads // size,
                intermediate_size=c.intermediate_size // size,
            ),
            group,
        )
    return model


def serve_tokens(
    model: Llama | PagedModel, seq_ids, positions, device="cpu", seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids < vocab_size - 1, positions) of tokens (seq_ids[i], positions[i]); fills and makes current
    the model's metadata. The last token id is never drawn (free for a poison row)."""
    c, seq_ids, positions = model.config, torch.as_tensor(seq_ids).cpu(), torch.as_tensor(positions).cpu()
    if (
        len(positions) > c.max_tokens
        or int(positions.max()) >= c.max_context
        or int(seq_ids.max()) >= c.max_seqs
    ):
        raise ValueError(
            f"at most {c.max_tokens} tokens, sequences < {c.max_seqs}, positions < {c.max_context}"
        )
    ids = torch.randint(0, c.vocab_size - 1, positions.shape, generator=torch.Generator().manual_seed(seed))
    model.attn_metadata.set_batch(seq_ids, positions)
    make_current(model.attn_metadata)
    return ids.to(device), positions.to(device)


def decode_batch(model: Llama | PagedModel, batch: int, device="cpu", seed: int = 0, positions=None):
    """`batch` decode tokens: token i continues sequence i at `positions[i]` (default: random), over earlier
    writes."""
    if positions is None:
        positions = torch.randint(
            model.config.max_context, (batch,), generator=torch.Generator().manual_seed(seed + 1)
        )
    return serve_tokens(model, torch.arange(batch), positions, device, seed)


def prefill_batch(
    model: Llama | PagedModel, n: int, device="cpu", seed: int = 0, seq: int = 0, start: int = 0
):
    """`n` tokens of sequence `seq` at positions start..start+n-1 (token i attends to positions <=
    start+i)."""
    return serve_tokens(model, torch.full((n,), seq), torch.arange(start, start + n), device, seed)
