"""Toy models, defined as vLLM's compilation tests define them, plus closed forms to check them against.

`silly::attention(q, k, v, out)` stands in for attention: it writes `q + k + v` into `out` and returns
nothing, so it is a splitting op whose result flows only through a mutated buffer, the hard case for piecewise
graphs.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

__all__ = [
    "SPLITTING_OPS",
    "SillyModel",
    "ToyLlama",
    "ToyLlamaConfig",
    "silly_model_expected",
    "toy_llama_inputs",
    "tractable_toy_llama",
    "tractable_expected",
]

# What the toy models call. A test or strategy that also calls `silly::pair` names both ops itself: listing an
# op the graph never calls gets the absent-splitting-op WARNING on every compile.
SPLITTING_OPS = ["silly::attention"]


# Registered through torch.library.Library rather than @custom_op, as engines register their attention ops:
# custom_op's Python wrapper costs tens of microseconds per call, and this op runs eagerly between graphs.
_silly = torch.library.Library("silly", "FRAGMENT")
_silly.define("attention(Tensor q, Tensor k, Tensor v, Tensor(a!) out) -> ()")


def silly_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
    torch.add(q, k, out=out)
    out.add_(v)


_silly.impl("attention", silly_attention, "CompositeExplicitAutograd")


torch.library.register_fake("silly::attention")(lambda q, k, v, out: None)  # writes only into `out`


@torch.library.custom_op("silly::pair", mutates_args=())
def silly_pair(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A splitting op with two freshly allocated outputs: `(x + 1, 2 * x)`."""
    return x + 1, 2 * x


@silly_pair.register_fake
def _(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty_like(x), torch.empty_like(x)


class SillyModel(nn.Module):
    """`x+1; x+2; attn; x-2; x-1; attn; x+1` on a 1-D tensor: 5 pieces, 3 of them compiled
    (`silly_model_expected`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + 1
        x = x + 2
        out = torch.empty_like(x)
        torch.ops.silly.attention(x, x, x, out)
        x = out
        x = x - 2
        x = x - 1
        out = torch.empty_like(x)
        torch.ops.silly.attention(x, x, x, out)
        x = out
        x = x + 1
        return x


def silly_model_expected(x: torch.Tensor) -> torch.Tensor:
    """Closed form of SillyModel: ((3(x+3)) - 3) * 3 + 1 = 9x + 19."""
    return 9 * x + 19


@dataclasses.dataclass
class ToyLlamaConfig:
    hidden_size: int = 128
    mlp_size: int = 256
    vocab_size: int = 128
    num_layers: int = 12


class ToyAttention(nn.Module):
    def __init__(self, config: ToyLlamaConfig) -> None:
        super().__init__()
        self.qkv_proj = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.hidden_size = config.hidden_size

    def forward(self, positions: torch.Tensor, hidden_states: torch.Tensor) -> torch.Tensor:
        qkv = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.hidden_size] * 3, dim=-1)
        q += positions[:, None]  # in place on views of qkv, as vLLM's toy does
        k += positions[:, None]
        out = torch.empty_like(q)
        torch.ops.silly.attention(q, k, v, out)
        return self.o_proj(out)


class ToyMLP(nn.Module):
    def __init__(self, config: ToyLlamaConfig) -> None:
        super().__init__()
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.mlp_size, bias=False)
        self.down_proj = nn.Linear(config.mlp_size, config.hidden_size, bias=False)
        self.mlp_size = config.mlp_size

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.gate_up_proj(x)
        x = x[:, : self.mlp_size] * torch.relu(x[:, self.mlp_size :])
        return self.down_proj(x)


class ToyDecoderLayer(nn.Module):
    def __init__(self, config: ToyLlamaConfig) -> None:
        super().__init__()
        self.self_attn = ToyAttention(config)
        self.mlp = ToyMLP(config)

    def forward(
        self, positions: torch.Tensor, hidden_states: torch.Tensor, residual: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if residual is not None:
            hidden_states = hidden_states + residual
        residual = hidden_states
        hidden_states = hidden_states + 1
        hidden_states = self.self_attn(positions, hidden_states)
        hidden_states = hidden_states + residual
        residual = hidden_states
        hidden_states = hidden_states + 1
        hidden_states = self.mlp(hidden_states)
        return hidden_states, residual


class ToyLlama(nn.Module):
    """A llama-shaped toy: L layers give 2L+1 pieces, L+1 of them compiled. Inputs: token ids [B], positions
    [B]."""

    def __init__(self, config: ToyLlamaConfig | None = None) -> None:
        super().__init__()
        self.config = config or ToyLlamaConfig()
        self.embed_tokens = nn.Embedding(self.config.vocab_size, self.config.hidden_size)
        self.layers = nn.ModuleList(ToyDecoderLayer(self.config) for _ in range(self.config.num_layers))
        # Small weights keep 12 layers of `gate * relu(up)` finite (the default init overflows to inf/NaN).
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        hidden_states = self.embed_tokens(input_ids)
        residual = None
        for layer in self.layers:
            hidden_states, residual = layer(positions, hidden_states, residual)
        return hidden_states


def toy_llama_inputs(
    batch: int, config: ToyLlamaConfig | None = None, device: str | torch.device = "cpu", seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random token ids and positions for a batch of `batch` tokens."""
    config = config or ToyLlamaConfig()
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, config.vocab_size, (batch,), generator=gen)
    positions = torch.randint(0, 4, (batch,), generator=gen)
    return input_ids.to(device), positions.to(device)


def tractable_toy_llama(config: ToyLlamaConfig | None = None) -> ToyLlama:
    """ToyLlama with identity blocks (2 layers unless `config` says otherwise), see `tractable_expected`:
    embedding rows of ones, qkv three stacked identities, o_proj the identity, gate_up the identity atop zeros
    in both halves, down_proj [I | 0]. Every hidden column of a row holds the same value: a recursion on one
    number per token."""
    config = config or ToyLlamaConfig(num_layers=2)
    if config.mlp_size < config.hidden_size:
        raise ValueError("tractable_toy_llama needs mlp_size >= hidden_size")
    model = ToyLlama(config)
    h, m = config.hidden_size, config.mlp_size
    with torch.no_grad():
        model.embed_tokens.weight.fill_(1.0)
        for layer in model.layers:
            assert isinstance(layer, ToyDecoderLayer)  # ToyLlama's layers
            layer.self_attn.qkv_proj.weight.copy_(torch.cat([torch.eye(h)] * 3))
            layer.self_attn.o_proj.weight.copy_(torch.eye(h))
            layer.mlp.gate_up_proj.weight.copy_(torch.cat([torch.eye(m, h)] * 2))
            layer.mlp.down_proj.weight.copy_(torch.eye(h, m))
    return model


def tractable_expected(positions: torch.Tensor, config: ToyLlamaConfig | None = None) -> torch.Tensor:
    """The output of `tractable_toy_llama` in closed form, computed in float64 on one number per token."""
    config = config or ToyLlamaConfig(num_layers=2)
    p = positions.detach().to("cpu", torch.float64)
    h = torch.ones_like(p)
    residual = None
    for _ in range(config.num_layers):
        if residual is not None:
            h = h + residual
        residual, h = h, h + 1
        h = 3 * h + 2 * p  # q + k + v with q, k shifted by the position, then o_proj = I
        h = h + residual
        residual, h = h, h + 1
        h = h * torch.relu(h)  # gate * relu(up), both the identity
    return h[:, None].expand(-1, config.hidden_size)
