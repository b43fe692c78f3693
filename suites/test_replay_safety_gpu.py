"""Replay safety: moved inputs, padding and outputs, never stale or garbage values.

- A splitting op that returns freshly allocated tensors (`silly::pair`) feeds a captured piece: when its
  outputs move, a replay either raises `ReplayAddressError` naming the piece and the input, or gives eager's
  results; never the stale values at the captured address. Likewise a caller-owned input that moves (the raw
  backend, where the caller owns the buffers).
- Padded outputs are cut back in every output structure; rows poisoned with NaN/inf in one call never reach
  real rows of a later call; padded rows never hold uninitialised values (a garbage token id is an
  out-of-bounds gather, a sticky CUDA error: that case runs in a process of its own, so it fails one test, not
  the session).
The hypothesis properties use `S.gpu_settings()`: no shrinking, a failure is reported as found.
"""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn as nn
from hypothesis import example, given
from hypothesis import strategies as st

import pieceworks
from pieceworks import CompilationConfig, CUDAGraphMode
from pieceworks.cudagraph import ReplayAddressError
from pieceworks.harness.adapters import Pieceworks
from pieceworks.harness.models import toy as models
from pieceworks.harness.testing import strategies as S
from pieceworks.harness.testing.scenario import run_case

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]

SETTINGS = S.gpu_settings(fraction=5)
SIZES = S.capture_sizes(32, max_count=4)
STEPS = st.lists(st.tuples(st.integers(1, 40), st.booleans()), min_size=2, max_size=8)
MODES = st.sampled_from(["PIECEWISE", "FULL", "FULL_AND_PIECEWISE"])
NAMED = re.compile(r"(piece \S+ .*|full graph: )input \d+ \(\w+\)")  # which graph, which input


def _inputs(batch: int, seed: int = 0):
    return S.program_inputs(batch, seed=seed, device="cuda")


def _close(got, expected):
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.shape == expected.shape, (type(got), expected.shape)
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5, equal_nan=True)
    elif isinstance(expected, dict):
        assert isinstance(got, dict) and got.keys() == expected.keys(), (got, expected)
        for k in expected:
            _close(got[k], expected[k])
    else:
        assert type(got) is type(expected) and len(got) == len(expected), (got, expected)
        for g, e in zip(got, expected):
            _close(g, e)


def _occupy_freed_blocks(keep: list) -> None:
    """Take the small blocks the last call freed, so the next fresh allocation lands elsewhere (NaN if
    read)."""
    keep.extend(torch.full((n,), float("nan"), device="cuda") for n in (128, 256) for _ in range(16))


# ---- 2. replay address checks ------------------------------------------------------------------------------
def _with_pair(program_and_source):
    """`program` plus `silly::pair` of one of its values and a compiled op reading both fresh outputs
    (returned)."""
    (instructions, outputs), source = program_and_source
    n = S.value_count(instructions)
    return instructions + (("pair", source % n), ("binary", "mul", n, n + 1)), outputs + (n + 2,)


PAIR_PROGRAMS = st.tuples(
    S.programs(max_len=5, splitting=("attention", "pair"), mutate_inputs=False), st.integers(0, 63)
).map(_with_pair)


SIN = ("unary", "sin", 0)
ATTN = ("attention", 2, 2, 0)  # sin(x) and x into silly::attention: a split, pieces before and after


@SETTINGS
@given(program=PAIR_PROGRAMS, sizes=SIZES, steps=STEPS)
@example(
    program=((SIN, ("pair", 2), ("binary", "mul", 3, 4)), (2, 5)),
    sizes=[8],
    steps=[(5, True), (5, True), (5, False)],
)  # the pair's outputs move after each call
def test_fresh_split_outputs_raise_or_are_right_never_stale(program, sizes, steps):
    torch._dynamo.reset()
    module = S.ProgramModule(program).cuda()
    built = Pieceworks("PIECEWISE", compiler="eager").build(
        module, _inputs, sizes, ["silly::attention", "silly::pair"]
    )
    keep: list = []
    for i, (batch, move) in enumerate(steps):
        args = _inputs(batch, seed=i + 1)
        expected = module(*args)
        try:
            got = built(*args)
        except ReplayAddressError as exc:
            assert NAMED.search(str(exc)), str(exc)
        else:
            _close(got, expected)
        if move:
            _occupy_freed_blocks(keep)


class _OneInput(nn.Module):
    """A program over `x` and `tanh(x)`: one caller-owned input, so the raw backend sees one batch symbol."""

    def __init__(self, program):
        super().__init__()
        self.program = S.ProgramModule(program)

    def forward(self, x):
        return self.program(x, torch.tanh(x))


@SETTINGS
@given(
    program=S.programs(max_len=5, splitting=("attention",), mutate_inputs=False),
    sizes=SIZES,
    steps=STEPS,
    mode=st.sampled_from([CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL]),
)
@example(
    program=((SIN, ATTN), (3,)),
    sizes=[8],
    steps=[(8, False), (8, True), (8, True)],
    mode=CUDAGraphMode.PIECEWISE,
)
def test_caller_inputs_that_move_raise_or_are_right_never_stale(program, sizes, steps, mode):
    """Through the raw backend the caller owns the input buffers: a captured size called with a tensor that is
    not the one captured (`move`) must raise or be right; called with the captured buffer it replays. The
    capture phase runs on the `Runtime` the backend returned to Dynamo, through Dynamo, from slices of one
    static buffer."""
    torch._dynamo.reset()
    # One more output computed from x: a program that only returns its input has nothing to capture (its graph
    # is `return x`), and the property needs replays.
    module = _OneInput(S.with_extra_output(program)).cuda()
    config = CompilationConfig(
        splitting_ops=["silly::attention"],
        compiler="eager",
        cudagraph_mode=mode,
        cudagraph_capture_sizes=sizes,
    )
    backend = pieceworks.Backend(config)
    fn = torch.compile(
        module,
        backend=backend,
        fullgraph=True,
        dynamic=False,
        options={"guard_filter_fn": lambda entries: [False] * len(entries)},
    )
    # At least 3 rows, whatever the sizes: the tracing call must have a batch >= 2, or Dynamo specialises the
    # batch to 1 and no later call has a batch size to capture (found on the H100 with sizes=[1]).
    static = _inputs(max(*sizes, 3))[0]
    first = static[:3].clone()
    torch._dynamo.mark_dynamic(first, 0)
    fn(first)
    (runtime,) = backend.runtimes
    with runtime.capture_phase(sizes) as phase:
        for n, uniform in phase.plan:
            with pieceworks.uniform_decode(uniform):
                fn(static[:n])
    assert sorted(runtime.captured_sizes) == sorted(sizes), (
        "every size captured: the steps below replay, not run eagerly"
    )
    for i, (batch, move) in enumerate(steps):
        fresh = _inputs(batch, seed=i + 1)[0]
        if move or batch > max(sizes):
            x = fresh
        else:
            static[:batch].copy_(fresh)
            x = static[:batch]
        expected = module(x.clone())
        try:
            got = fn(x)
        except ReplayAddressError as exc:
            assert move and NAMED.search(str(exc)), str(exc)
        else:
            _close(got, expected)


# ---- 3. padding and outputs --------------------------------------------------------------------------------
def _structure_case(program, structure, sizes, batches, mode):
    torch._dynamo.reset()
    module = S.StructureModule(program, structure).cuda()
    built = Pieceworks(mode, compiler="eager").build(module, _inputs, sizes, ["silly::attention"])
    for i, batch in enumerate(batches):
        args = _inputs(batch, seed=i + 1)
        _close(built(*args), module(*args))


@SETTINGS
@given(
    program=S.programs(max_len=4, splitting=("attention",), mutate_inputs=False),
    structure=S.output_structures(),
    sizes=SIZES,
    batches=st.lists(st.integers(1, 40), min_size=1, max_size=5),
    mode=MODES,
)
@example(
    program=((SIN, ATTN), (3,)),
    structure=(("value", 3), [("value", 0), (("value", 2),)]),
    sizes=[8],
    batches=[3],
    mode="PIECEWISE",
)
def test_padded_outputs_are_cut_back_in_nested_tuples_and_lists(program, structure, sizes, batches, mode):
    _structure_case(program, structure, sizes, batches, mode)


@SETTINGS
@given(
    program=S.programs(max_len=4, splitting=("attention",), mutate_inputs=False),
    structure=S.output_structures(dicts=True, unbatched=True),
    sizes=SIZES.map(lambda s: sorted(set(s) | {S.HIDDEN})),
    batches=st.lists(st.integers(1, 12), min_size=1, max_size=5),
    mode=MODES,
)
@example(
    program=((SIN, ATTN), (3,)),
    structure={"a": ("value", 3), "b": [("weight",)]},
    sizes=[4, 8],
    batches=[3],
    mode="PIECEWISE",
)
def test_padded_outputs_are_cut_back_in_dicts_and_only_along_the_batch(
    program, structure, sizes, batches, mode
):
    """Dicts too; and an output without a batch dimension (shape [HIDDEN], HIDDEN a captured size) is not
    cut."""
    _structure_case(program, structure, sizes, batches, mode)


POISONS = st.sampled_from([None, float("nan"), float("inf"), float("-inf")])


@SETTINGS
@given(
    program=S.programs(max_len=6, splitting=("attention",), mutate_inputs=False),
    sizes=SIZES,
    steps=st.lists(st.tuples(st.integers(1, 40), POISONS), min_size=2, max_size=8),
    mode=MODES,
)
@example(program=((SIN, ATTN), (3,)), sizes=[8], steps=[(8, float("nan")), (3, None)], mode="PIECEWISE")
def test_poisoned_rows_never_reach_the_rows_of_later_calls(program, sizes, steps, mode):
    """Calls whose every other row is NaN or +-inf leave those rows in the static buffers; later (clean or
    poisoned) calls must give eager's values row for row: padding never mixes into real rows."""
    torch._dynamo.reset()
    module = S.ProgramModule(program).cuda()
    built = Pieceworks(mode, compiler="eager").build(module, _inputs, sizes, ["silly::attention"])
    for i, (batch, poison) in enumerate(steps):
        x, y = _inputs(batch, seed=i + 1)
        if poison is not None:
            x[::2] = poison
        expected = module(x.clone(), y.clone())
        _close(built(x, y), expected)


def uninitialised_rows_case(modes: list[str]) -> dict:
    """Run in a process of its own by the test below: ToyLlama (token ids gathered by an embedding) served at
    sizes that pad, in each mode; every output compared with eager. Uninitialised padded token ids would be an
    out-of-bounds gather: a device-side assert or illegal address, sticky for the process."""
    torch.manual_seed(0)
    config = models.ToyLlamaConfig(num_layers=1)
    model = models.ToyLlama(config).cuda()
    checked = 0
    with torch.no_grad():
        for mode in modes:
            torch._dynamo.reset()
            inputs = lambda b: models.toy_llama_inputs(b, config, "cuda", seed=b)  # noqa: E731 - a one-line factory
            built = Pieceworks(mode, compiler="eager").build(model, inputs, [4, 16, 64], models.SPLITTING_OPS)
            for batch in [1, 5, 17, 3, 64, 2]:
                args = inputs(batch)
                torch.testing.assert_close(built(*args), model(*args), rtol=1e-4, atol=1e-5)
                checked += 1
            torch.cuda.synchronize()
    return {"checked": checked}


def test_padded_rows_never_hold_uninitialised_values():
    result = run_case(f"{__file__}:uninitialised_rows_case", {"modes": ["PIECEWISE", "FULL"]}, timeout=100)
    assert result == {"checked": 12}
