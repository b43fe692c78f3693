"""Hypothesis strategies for piecewise compilation, reusable for other backends (docs/testing.md lists them).

A `programs()` draw is a tuple of plain tuples, so a failure prints (and shrinks to) a readable list of
instructions; `ProgramModule(program)` is an `nn.Module` that Dynamo traces into one graph with a symbolic
batch dimension, its splitting ops (`silly::attention`, writing into a buffer; `silly::pair`, returning two
fresh tensors) anywhere. `register_profiles()` registers the `ci`, `dev`, `nightly` and `find-only` profiles;
`gpu_settings()` a GPU property's.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn as nn
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from ..models import toy  # noqa: F401 - registers the silly ops

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
    "corrupt",
    "register_profiles",
    "gpu_settings",
    "output_structures",
    "StructureModule",
    "value_count",
    "with_extra_output",
]

HIDDEN = 4
_UNARY = {
    "sin": torch.sin,
    "tanh": torch.tanh,
    "relu": torch.relu,
    "neg": torch.neg,
    "half": lambda v: v * 0.5,
    "plus_one": lambda v: v + 1,
}
UNARY = tuple(_UNARY)
BINARY = ("add", "mul", "sub")
SPLITTING = ("attention", "pair")
_NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]


@st.composite
def programs(
    draw: Any, max_len: int = 10, splitting: tuple[str, ...] = SPLITTING, mutate_inputs: bool = True
) -> tuple:
    """A random program over two inputs `x, y` of shape [B, HIDDEN]; values are numbered in creation order."""
    n_values, program = 2, []
    kinds = ["unary", "binary", "matmul", "permute", "split_cat", "size", "inplace", *splitting]
    low = 0 if mutate_inputs else 2  # the first value an in-place write may target
    for _ in range(draw(st.integers(1, max_len))):
        kind = draw(st.sampled_from(kinds))
        if kind == "inplace" and n_values <= low:
            continue  # no target to write into yet
        pick = st.integers(0, n_values - 1)
        operands = {
            "unary": (st.sampled_from(UNARY), pick),
            "binary": (st.sampled_from(BINARY), pick, pick),
            "matmul": (pick, st.integers(0, 2)),
            "inplace": (st.integers(low, n_values - 1), pick),
            "attention": (pick, pick, pick),
        }.get(kind, (pick,))
        program.append(draw(st.tuples(st.just(kind), *operands)))
        n_values = value_count(tuple(program))
    if not program:  # only in-place writes were drawn and none had a target: a model must compute something
        program.append(("unary", "sin", 0))
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


class ProgramModule(nn.Module):
    """Runs a program from `programs()`; its weights are fixed by `seed`. Rows are independent of each
    other."""

    def __init__(self, program: tuple, seed: int = 0) -> None:
        super().__init__()
        self.instructions, self.outputs = program
        gen = torch.Generator().manual_seed(seed)
        self.weight = nn.Parameter(
            torch.randn(3, HIDDEN, HIDDEN, generator=gen) / HIDDEN, requires_grad=False
        )

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values = [x, y]
        for ins in self.instructions:
            kind = ins[0]
            if kind == "unary":
                values.append(_UNARY[ins[1]](values[ins[2]]))
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


def program_inputs(
    batch: int, seed: int = 0, device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x, y = (torch.randn(batch, HIDDEN, generator=gen) for _ in range(2))
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


def index_entries() -> st.SearchStrategy[dict[str, dict[str, Any]]]:
    names = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40)
    entry = st.fixed_dictionaries(
        {
            "file": st.from_regex(r"[0-9a-f]{1,32}\.bin", fullmatch=True),
            "sha256": st.from_regex(r"[0-9a-f]{64}", fullmatch=True),
            "bytes": st.integers(0, 2**40),
        }
    )
    return st.dictionaries(names, entry, max_size=8)


def corruptions() -> st.SearchStrategy[tuple]:
    """Damage to apply to a file's bytes: ("truncate", n), ("flip", i, mask), ("digit", i, d) (the i-th
    decimal digit changed by d: damage that keeps JSON well formed), ("garbage", bytes), ("empty",),
    ("version",) (a well-formed file of another version)."""
    offset = st.integers(0, 10_000)
    return st.one_of(
        st.tuples(st.just("truncate"), offset),
        st.tuples(st.just("digit"), offset, st.integers(1, 9)),
        st.tuples(st.just("flip"), offset, st.integers(1, 255)),
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


_LOADED: list[str] = []  # the profile register_profiles loaded, once per process


def register_profiles() -> None:
    """Register `ci` (derandomized, bounded), `dev`, `nightly` and `find-only`, none with a deadline, and, at
    the first call in a process only, load $PIECEWORKS_HYPOTHESIS_PROFILE (default `ci` under CI=true, else
    `dev`; `--hypothesis-profile NAME` overrides: a later call, from a conftest imported after pytest read the
    option, does not undo it)."""
    # Tests take fixtures for the whole test (a fresh Dynamo, no_grad), and reset Dynamo per example
    # themselves.
    common: dict[str, Any] = dict(
        deadline=None,
        print_blob=True,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.function_scoped_fixture,
        ],
    )
    settings.register_profile("ci", derandomize=True, max_examples=25, **common)
    settings.register_profile("dev", max_examples=50, **common)
    settings.register_profile("nightly", max_examples=1000, **common)
    # finds a failure without shrinking it (mutant runs on a GPU, where a shrink step compiles and captures)
    settings.register_profile("find-only", max_examples=25, derandomize=True, phases=_NO_SHRINK, **common)
    if not _LOADED:
        _LOADED.append(
            os.environ.get("PIECEWORKS_HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev")
        )
        settings.load_profile(_LOADED[0])


def gpu_settings(fraction: int = 3, **overrides: Any) -> settings:
    """Settings for a GPU property: `1/fraction` of the loaded profile's examples (at least 3), and no
    shrinking (each shrink step would compile and capture a model): the first failing example is reported as
    found, with its seed. `PIECEWORKS_GPU_SHRINK=1 pytest ... --hypothesis-seed N` reproduces and shrinks
    it."""
    phases = list(Phase) if os.environ.get("PIECEWORKS_GPU_SHRINK") else _NO_SHRINK
    assert settings.default is not None  # hypothesis loads its default profile when imported
    base = dict(
        max_examples=max(3, settings.default.max_examples // fraction),
        phases=phases,
        deadline=None,
        report_multiple_bugs=False,
    )
    return settings(settings.default, **{**base, **overrides})


# ---- output structures, for unpadding ----------------------------------------------------------------------
def output_structures(
    max_leaves: int = 6, dicts: bool = False, unbatched: bool = False
) -> st.SearchStrategy[Any]:
    """A leaf, or a nested structure of tuples and lists (and dicts if `dicts`) of leaves: ("value", k), the
    k-th value of a program, a [B, HIDDEN] tensor (k taken modulo the program's value count); and if
    `unbatched`, ("weight",): a tensor without a batch dimension, of shape [HIDDEN], which no unpadding may
    cut."""
    leaf = st.tuples(st.just("value"), st.integers(0, 63))
    if unbatched:
        leaf = st.one_of(leaf, st.just(("weight",)))

    def nest(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        options: list[st.SearchStrategy[Any]] = [
            st.lists(children, min_size=1, max_size=3).map(tuple),
            st.lists(children, min_size=1, max_size=3),
        ]
        if dicts:
            options.append(st.dictionaries(st.sampled_from("abc"), children, min_size=1, max_size=3))
        return st.one_of(options)

    return st.recursive(leaf, nest, max_leaves=max_leaves)  # a bare leaf too: one tensor returned


class StructureModule(nn.Module):
    """A `ProgramModule` whose outputs are arranged in `structure` (see `output_structures`)."""

    def __init__(self, program: tuple, structure: Any, seed: int = 0) -> None:
        super().__init__()
        instructions, _ = program
        self.count = value_count(instructions)
        self.program = ProgramModule((instructions, tuple(range(self.count))), seed)
        self.structure = structure

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> Any:
        return self._build(self.structure, self.program(x, y))

    def _build(self, node: Any, values: tuple) -> Any:
        if isinstance(node, dict):
            return {k: self._build(v, values) for k, v in node.items()}
        if isinstance(node, list):
            return [self._build(v, values) for v in node]
        if node[0] == "value":  # a leaf (a tuple whose first item is its kind)
            return values[node[1] % self.count] * 1.0
        if node[0] == "weight":
            return self.program.weight[0, 0] * 1.0
        return tuple(self._build(v, values) for v in node)
