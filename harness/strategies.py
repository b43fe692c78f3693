"""Hypothesis strategies for piecewise compilation, reusable for other backends.

- `programs()`: random straight-line models over a palette of ops (elementwise, matmul, views, several-output ops,
  size-dependent ops, in-place writes to inputs and intermediates) with splitting ops (`silly::attention`, writing
  into a buffer; `silly::pair`, returning two fresh tensors) anywhere: first, last, back to back, feeding each other.
  A program is a tuple of plain tuples, so a failure prints (and shrinks to) a readable list of instructions, and
  `ProgramModule(program)` is an `nn.Module` that Dynamo traces into one graph with a symbolic batch dimension.
- `capture_sizes()`, `compile_ranges()`, `batch_sequences()`: size sets and serving sequences.
- `index_entries()`, `corruptions()`: cache index contents and byte-level damage.
- `register_profiles()`: the `ci`, `dev` and `nightly` profiles.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn as nn
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from . import models  # noqa: F401 - registers the silly ops

__all__ = [
    "HIDDEN",
    "ProgramModule",
    "programs",
    "program_inputs",
    "capture_sizes",
    "compile_ranges",
    "batch_sequences",
    "index_entries",
    "corruptions",
    "register_profiles",
    "value_count",
    "with_extra_output",
]

HIDDEN = 4
UNARY = ("sin", "tanh", "relu", "neg", "half", "plus_one")
BINARY = ("add", "mul", "sub")
SPLITTING = ("attention", "pair")


@st.composite
def programs(draw: Any, max_len: int = 10, splitting: tuple[str, ...] = SPLITTING, mutate_inputs: bool = True) -> tuple:
    """A random program over two inputs `x, y` of shape [B, HIDDEN]; values are numbered in creation order."""
    n_values = 2
    program = []
    kinds = ["unary", "binary", "matmul", "permute", "split_cat", "size", "inplace"] + list(splitting)
    for _ in range(draw(st.integers(1, max_len))):
        kind = draw(st.sampled_from(kinds))
        pick = st.integers(0, n_values - 1)
        if kind == "unary":
            program.append(("unary", draw(st.sampled_from(UNARY)), draw(pick)))
        elif kind == "binary":
            program.append(("binary", draw(st.sampled_from(BINARY)), draw(pick), draw(pick)))
        elif kind == "matmul":
            program.append(("matmul", draw(pick), draw(st.integers(0, 2))))
        elif kind in ("permute", "split_cat", "size"):
            program.append((kind, draw(pick)))
        elif kind == "inplace":
            low = 0 if mutate_inputs else 2
            if n_values > low:
                program.append(("inplace", draw(st.integers(low, n_values - 1)), draw(pick)))
            continue  # writes in place: no new value
        elif kind == "attention":
            program.append(("attention", draw(pick), draw(pick), draw(pick)))
        elif kind == "pair":
            program.append(("pair", draw(pick)))
            n_values += 1  # two outputs
        n_values += 1
    outputs = draw(st.lists(st.integers(0, n_values - 1), min_size=1, max_size=3, unique=True))
    return tuple(program), tuple(outputs)


def value_count(instructions: tuple) -> int:
    """How many values a program's instructions leave (the two inputs included)."""
    made = {"inplace": 0, "pair": 2}
    return 2 + sum(made.get(ins[0], 1) for ins in instructions)


def with_extra_output(program: tuple) -> tuple:
    """`program` plus one more instruction (`sin` of the first input) whose value is also returned."""
    instructions, outputs = program
    return instructions + (("unary", "sin", 0),), outputs + (value_count(instructions),)


def _unary(name: str, v: torch.Tensor) -> torch.Tensor:
    if name == "half":
        return v * 0.5
    if name == "plus_one":
        return v + 1
    return getattr(torch, name)(v)


class ProgramModule(nn.Module):
    """Runs a program from `programs()`; its weights are fixed by `seed`. Rows are independent of each other."""

    def __init__(self, program: tuple, seed: int = 0) -> None:
        super().__init__()
        self.instructions, self.outputs = program
        gen = torch.Generator().manual_seed(seed)
        self.weight = nn.Parameter(torch.randn(3, HIDDEN, HIDDEN, generator=gen) / HIDDEN, requires_grad=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values = [x, y]
        for ins in self.instructions:
            kind = ins[0]
            if kind == "unary":
                values.append(_unary(ins[1], values[ins[2]]))
            elif kind == "binary":
                a, b = values[ins[2]], values[ins[3]]
                values.append(a + b if ins[1] == "add" else a * b if ins[1] == "mul" else a - b)
            elif kind == "matmul":
                values.append(torch.tanh(values[ins[1]] @ self.weight[ins[2]]))
            elif kind == "permute":  # a view round trip: [B, H] -> [B, 2, H/2] -> transposed -> [B, H]
                v = values[ins[1]]
                values.append(v.view(v.shape[0], 2, HIDDEN // 2).transpose(1, 2).reshape(v.shape[0], HIDDEN))
            elif kind == "split_cat":  # an op with several outputs, unpacked with getitem
                a, b = values[ins[1]].split(HIDDEN // 2, dim=-1)
                values.append(torch.cat([b, a], dim=-1))
            elif kind == "size":  # reads the symbolic batch size, and passes a torch.Size on
                v = values[ins[1]]
                values.append(v.reshape(v.size()) + torch.ones(v.size(0), 1, dtype=v.dtype, device=v.device))
            elif kind == "inplace":
                values[ins[1]].mul_(0.5).add_(torch.tanh(values[ins[2]]))
            elif kind == "attention":
                out = torch.empty_like(values[ins[1]])
                torch.ops.silly.attention(values[ins[1]], values[ins[2]], values[ins[3]], out)
                values.append(torch.tanh(out))
            elif kind == "pair":
                a, b = torch.ops.silly.pair(values[ins[1]])
                values.extend([torch.tanh(a), torch.tanh(b)])
        return tuple(values[i] for i in self.outputs)


def program_inputs(batch: int, seed: int = 0, device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, HIDDEN, generator=gen)
    y = torch.randn(batch, HIDDEN, generator=gen)
    return x.to(device), y.to(device)


def capture_sizes(max_size: int = 64, max_count: int = 12) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(1, max_size), min_size=1, max_size=max_count, unique=True).map(sorted)


def compile_ranges(max_tokens: int = 512) -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(1, max_tokens), max_size=5, unique=True).map(sorted)


def batch_sequences(max_size: int = 64, beyond: int = 16, max_len: int = 12) -> st.SearchStrategy[list[int]]:
    """Batch sizes to serve in order: random, ascending, descending, repeated; some above the largest size."""
    sizes = st.integers(1, max_size + beyond)
    plain = st.lists(sizes, min_size=1, max_size=max_len)
    return st.one_of(
        plain,
        plain.map(sorted),
        plain.map(lambda s: sorted(s, reverse=True)),
        st.tuples(sizes, st.integers(2, 5)).map(lambda t: [t[0]] * t[1]),
    )


_names = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=40)
_files = st.from_regex(r"[0-9a-f]{1,32}\.bin", fullmatch=True)


def index_entries() -> st.SearchStrategy[dict[str, dict[str, Any]]]:
    entry = st.fixed_dictionaries({
        "file": _files,
        "sha256": st.from_regex(r"[0-9a-f]{64}", fullmatch=True),
        "bytes": st.integers(0, 2**40),
    })
    return st.dictionaries(_names, entry, max_size=8)


def corruptions() -> st.SearchStrategy[tuple]:
    """Damage to apply to a file's bytes: ("truncate", n), ("flip", i, mask), ("digit", i, d) (the i-th decimal
    digit changed by d: damage that keeps JSON well formed), ("garbage", bytes), ("empty",), ("version",) (a
    well-formed file of another version)."""
    return st.one_of(
        st.tuples(st.just("truncate"), st.integers(0, 10_000)),
        st.tuples(st.just("digit"), st.integers(0, 10_000), st.integers(1, 9)),
        st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
        st.tuples(st.just("garbage"), st.binary(max_size=200)),
        st.just(("empty",)),
        st.just(("version",)),
    )


def corrupt(data: bytes, damage: tuple) -> bytes:
    """Apply a `corruptions()` draw; the result always differs from `data` unless `data` is empty."""
    kind = damage[0]
    if kind == "truncate":
        return data[: min(damage[1], max(len(data) - 1, 0))]
    if kind == "flip":
        if not data:
            return b"\x00"
        i = damage[1] % len(data)
        return data[:i] + bytes([data[i] ^ damage[2]]) + data[i + 1 :]
    if kind == "digit":
        digits = [i for i, b in enumerate(data) if 48 <= b <= 57]
        if not digits:
            return data + b"0"
        i = digits[damage[1] % len(digits)]
        return data[:i] + bytes([48 + (data[i] - 48 + damage[2]) % 10]) + data[i + 1 :]
    if kind == "garbage":
        return damage[1] if damage[1] != data else damage[1] + b"\x00"
    if kind == "empty":
        return b""
    return data.replace(b'"version": 1', b'"version": 2')


def register_profiles() -> None:
    """`ci`: derandomized, bounded, no deadline; `dev`: the defaults without a deadline; `nightly`: many examples.

    Pick one with `--hypothesis-profile NAME` or `PIECEWORKS_HYPOTHESIS_PROFILE`; `ci` is the default under CI=true.
    """
    # Tests take fixtures for the whole test (a fresh Dynamo, no_grad), and reset Dynamo per example themselves.
    common = dict(deadline=None, print_blob=True, suppress_health_check=[
        HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture])
    settings.register_profile("ci", derandomize=True, max_examples=25, **common)
    settings.register_profile("dev", max_examples=50, **common)
    settings.register_profile("nightly", max_examples=1000, **common)
    # Finds a failure without shrinking it: for mutant runs on a lent GPU, where each shrink step compiles and
    # captures a model and shrinking outlasts the lease.
    settings.register_profile("find-only", max_examples=25, derandomize=True,
                              phases=[Phase.explicit, Phase.reuse, Phase.generate], **common)
    default = "ci" if os.environ.get("CI") else "dev"
    settings.load_profile(os.environ.get("PIECEWORKS_HYPOTHESIS_PROFILE", default))
