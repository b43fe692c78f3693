"""Property-based suites (CPU): splitting semantics and structure, the cache index and key, dispatch and
padding.

Numbered as in the issue: 1 semantics, 2 structure, 3 index round trip and damage, 4 key, 5 dispatch and
padding, 10 argument checks. Property 7 (the cache state machine) is in test_cache_machine.py, property 6
(replay, GPU) in test_properties_gpu.py. Profiles: `--hypothesis-profile ci|dev|nightly` or
PIECEWORKS_HYPOTHESIS_PROFILE.
"""

from __future__ import annotations

import collections
import os
import re

import pytest
import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

import pieceworks
from pieceworks import CompilationConfig, CUDAGraphMode, InputError, counters
from pieceworks.cache import CacheIndexError, CompileCache, parse_index, serialize_index
from pieceworks.harness.testing import strategies as S
from pieceworks.key import cache_key
from pieceworks.padding import padded_size, unpad
from pieceworks.piece import BatchSizeError, compile_target
from pieceworks.split import is_splitting_op, split_graph
from suites.helpers import (
    SignatureModule,
    apply_mismatch,
    dynamo_graph,
    mismatches,
    signature_args,
    signatures,
)

SPLIT = ["silly::attention", "silly::pair"]


def _compile(program, compiler="eager", **kwargs):
    torch._dynamo.reset()
    config = CompilationConfig(
        splitting_ops=SPLIT, compiler=compiler, cudagraph_mode=CUDAGraphMode.NONE, **kwargs
    )
    return pieceworks.compile(S.ProgramModule(program), config)


def _same(got, expected):
    for g, e in zip(got, expected, strict=True):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6, equal_nan=True)


def _check_against_eager(compiled, module, batches):
    for batch in batches:
        x, y = S.program_inputs(batch, seed=batch)
        eager_in = (x.clone(), y.clone())
        expected = module(*eager_in)
        compiled_in = (x.clone(), y.clone())
        _same(compiled(*compiled_in), expected)
        _same(compiled_in, eager_in)  # input mutations happened identically


# ---- 1. splitting preserves semantics ----------------------------------------------------------------------
@given(program=S.programs(), batches=st.lists(st.integers(1, 40), min_size=1, max_size=3))
def test_split_model_equals_original(program, batches):
    compiled = _compile(program)
    _check_against_eager(compiled, compiled.model, batches)


@pytest.mark.inductor
@settings(max_examples=3)
@given(program=S.programs(max_len=6), batches=st.lists(st.integers(1, 40), min_size=1, max_size=2))
# Found by the dev profile: pieces that return nothing and write nothing (the batch-size check alone before
# silly::pair, the unread tanh of its outputs after it) leave Inductor no artifact to save: compiled on every
# start.
@example(program=((("pair", 0),), (0,)), batches=[1])
# and such a piece served from the serving record (an output that is not an input: the model gets a record)
@example(program=((("pair", 0),), (2,)), batches=[1])
def test_split_model_through_inductor_equals_original_and_reloads(program, batches, tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("cache"))
    compiled = _compile(program, compiler="inductor", cache_dir=cache)
    _check_against_eager(compiled, compiled.model, batches)
    compiles = counters.num_inductor_compiles
    again = _compile(program, compiler="inductor", cache_dir=cache)
    _check_against_eager(again, again.model, batches)  # 3: saved artifacts reload to the same outputs
    assert counters.num_inductor_compiles == compiles


# ---- 2. split structure ------------------------------------------------------------------------------------
def _ops(nodes):
    return [
        (n.op, str(n.target))
        for n in nodes
        if n.op in ("call_function", "call_method") and n.target is not torch.ops.aten.sym_size.int
    ]


@given(program=S.programs(max_len=12))
def test_split_structure(program):
    gm, _ = dynamo_graph(S.ProgramModule(program), S.program_inputs(5))
    split_gm, items = split_graph(gm, SPLIT)
    ops = set(SPLIT)
    calls = [n.target for n in split_gm.graph.nodes if n.op == "call_module"]
    assert calls == [i.submod_name for i in items] and len(set(calls)) == len(calls)  # each piece called once
    for before, after in zip(items, items[1:]):
        assert not (before.is_splitting_graph and after.is_splitting_graph), "consecutive splitting pieces"
    for item in items:
        for placeholder in (n for n in item.fx_graph.graph.nodes if n.op == "placeholder"):
            value = placeholder.meta.get("example_value")
            assert isinstance(value, (torch.Tensor, torch.SymInt, int)), (
                f"{item.submod_name} receives {type(value).__name__} {placeholder.name}: only tensors "
                "and sizes may cross a piece boundary"
            )
        nodes = [n for n in item.fx_graph.graph.nodes if n.op in ("call_function", "call_method")]
        if item.is_splitting_graph:
            assert all(is_splitting_op(n, ops) or n.target.__name__ == "getitem" for n in nodes)
            assert any(is_splitting_op(n, ops) for n in nodes)
        else:
            assert not any(is_splitting_op(n, ops) for n in nodes)
    pieces_in_order = [op for item in items for op in _ops(item.fx_graph.graph.nodes)]
    assert pieces_in_order == _ops(gm.graph.nodes)  # every op once, in the original order
    split_gm.graph.lint()  # well formed: every value defined before use, so no cycle


# ---- 3. cache index round trip and damage ------------------------------------------------------------------
@given(entries=S.index_entries())
def test_index_round_trip(entries):
    assert parse_index(serialize_index(entries)) == entries


@given(entries=S.index_entries(), damage=S.corruptions())
def test_damaged_index_is_a_clear_error_never_a_wrong_entry(entries, damage):
    data = serialize_index(entries)
    bad = S.corrupt(data, damage)
    assume(bad != data)
    try:
        parsed = parse_index(bad)
    except CacheIndexError as exc:
        assert str(exc)
        return
    assert parsed == entries  # only harmless damage (white space) may parse, and then to the same entries


@given(payload=st.binary(min_size=1, max_size=2000), damage=S.corruptions())
def test_damaged_artifact_never_loads(payload, damage, tmp_path_factory):
    cache = CompileCache(str(tmp_path_factory.mktemp("c")), "key")

    def save(path):
        with open(path, "wb") as f:
            f.write(payload)

    assert cache.store("range:1-8|p", save)
    entry = cache.read_index()["range:1-8|p"]
    path = os.path.join(cache.artifact_dir, entry["file"])
    bad = S.corrupt(payload, damage)
    with open(path, "wb") as f:
        f.write(bad)
    loaded, _ = cache.load("range:1-8|p", lambda p: open(p, "rb").read())
    assert loaded == (payload if bad == payload else None)


# ---- 4. cache key ------------------------------------------------------------------------------------------
_digests = st.from_regex(r"[0-9a-f]{8}", fullmatch=True)


@given(
    factors=st.fixed_dictionaries({"environment": _digests, "config": _digests, "graph": _digests}),
    which=st.sampled_from(["environment", "config", "graph"]),
    new=_digests,
)
def test_changing_any_one_factor_changes_the_key(factors, which, new):
    assume(new != factors[which])
    assert cache_key(factors) == cache_key(dict(reversed(list(factors.items()))))
    assert cache_key({**factors, which: new}) != cache_key(factors)


# The key covering every code factor and nothing per run, equally in another process, is test_cache_key.py's
# (all factors, one property).


# ---- 5. dispatch and padding -------------------------------------------------------------------------------
@given(sizes=S.capture_sizes(), batch=st.integers(1, 100))
def test_padding_picks_the_smallest_captured_size_at_least_the_batch(sizes, batch):
    chosen = padded_size(sizes, batch)
    fitting = [s for s in sizes if s >= batch]
    assert chosen == (min(fitting) if fitting else None)


_Wrapped = collections.namedtuple("_Wrapped", ["out", "weight"])


class _WrappedStructure(torch.nn.Module):
    """A `StructureModule`'s output and a [HIDDEN] weight, in a namedtuple (which Dynamo rebuilds outside the
    graph)."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x, y):
        return _Wrapped(self.module(x, y), self.module.program.weight[0] * 1.0)


@given(
    program=S.programs(max_len=4, splitting=("attention",), mutate_inputs=False),
    structure=S.output_structures(dicts=True, unbatched=True),
    wrap=st.booleans(),
    batch=st.integers(1, S.HIDDEN),
)
def test_padded_outputs_are_cut_back_exactly_where_the_trace_has_the_batch(program, structure, wrap, batch):
    """At padded size n = HIDDEN, `unpad` with the marks the runtime took from the trace cuts every output
    whose dim 0 is the batch (in tuples, lists, dicts, a namedtuple, which keeps its type) to the real rows,
    and leaves the [HIDDEN] weights whole: the result equals eager at the real batch (rows are
    independent)."""
    torch._dynamo.reset()
    module = S.StructureModule(program, structure)
    module = _WrappedStructure(module) if wrap else module
    config = CompilationConfig(splitting_ops=SPLIT, compiler="eager", cudagraph_mode=CUDAGraphMode.NONE)
    compiled = pieceworks.compile(module, config)
    n = S.HIDDEN
    x, y = S.program_inputs(n, seed=1)
    padded = compiled(x.clone(), y.clone())
    got = unpad(padded, batch, n, compiled.batched_outputs)
    expected = module(x[:batch].clone(), y[:batch].clone())
    _same_tree(got, expected)


def _same_tree(got, expected):
    assert type(got) is type(expected), (type(got), type(expected))
    if isinstance(expected, torch.Tensor):
        assert got.shape == expected.shape, (got.shape, expected.shape)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6, equal_nan=True)
    elif isinstance(expected, dict):
        assert list(got) == list(expected), (list(got), list(expected))
        for k in expected:
            _same_tree(got[k], expected[k])
    else:
        assert len(got) == len(expected), (len(got), len(expected))
        for g, e in zip(got, expected):
            _same_tree(g, e)


@given(
    ends=S.compile_ranges(),
    sizes=st.lists(st.integers(1, 512), max_size=4, unique=True),
    batch=st.integers(1, 600),
)
def test_compile_dispatch_exact_size_then_range_else_clear_error(ends, sizes, batch):
    config = CompilationConfig(compile_ranges=ends, compile_sizes=sizes, max_num_batched_tokens=512)
    ranges = config.ranges()
    assert ranges[0][0] == 1 and ranges[-1][1] == 512
    assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:]))  # contiguous, disjoint
    if batch > 512:
        with pytest.raises(BatchSizeError) as info:
            compile_target(config.compile_sizes, ranges, batch)
        assert str(batch) in str(info.value) and str(ranges[-1]) in str(info.value)
        return
    target = compile_target(config.compile_sizes, ranges, batch)
    if batch in sizes:
        assert target == batch
    else:
        lo, hi = target
        assert lo <= batch <= hi and (lo, hi) in ranges


# ---- 10. argument checks -----------------------------------------------------------------------------------
@settings(max_examples=max(5, settings.default.max_examples // 2))
@given(signature=signatures(), data=st.data())
def test_any_argument_mismatch_is_an_input_error_naming_the_argument(signature, data):
    """Compiled for one call, a call differing only in batch size runs and equals eager; a call differing in
    anything else (trailing sizes, rank, dtype, device, count, plain values, tensor vs value, disagreeing
    batch sizes) raises InputError naming what differs. One compile, several mismatches."""
    torch._dynamo.reset()
    module = SignatureModule()
    compiled = pieceworks.compile(
        module, CompilationConfig(compiler="eager", cudagraph_mode=CUDAGraphMode.NONE)
    )
    compiled(*signature_args(signature, 3))
    args = signature_args(signature, data.draw(st.integers(1, 9), label="batch"), seed=1)
    torch.testing.assert_close(compiled(*args), module(*args))
    for _ in range(3):
        mismatch = data.draw(mismatches(signature), label="mismatch")
        bad = apply_mismatch(args, mismatch)
        if bad is None:
            continue
        kind, i, _ = mismatch
        with pytest.raises(InputError) as info:
            compiled(*bad)
        message = str(info.value)
        if kind == "count":  # the call's form is checked first
            assert f"{len(signature)} arguments" in message and f"called with {len(bad)}" in message, message
        elif not any(isinstance(a, torch.Tensor) for a in bad):
            assert "at least one tensor argument" in message, message
        elif kind == "batch":
            assert "disagree on the batch size" in message and f"{i}: " in message, message
        else:
            assert f"argument {i} " in message, message


@pytest.mark.parametrize(
    ("compiled_with", "called_with"), [(2, 2.0), (2.0, 2), (1, True), (True, 1), (0, False)]
)
def test_a_plain_value_of_another_type_is_an_input_error(compiled_with, called_with):
    """`2 == 2.0 == True` in Python, but the trace baked in the type: a model compiled with `2` and called
    with `2.0` would return int64 where eager gives float32. The argument check compares type and value."""
    torch._dynamo.reset()
    module = SignatureModule()
    compiled = pieceworks.compile(
        module, CompilationConfig(compiler="eager", cudagraph_mode=CUDAGraphMode.NONE)
    )
    x = torch.randn(3, 2)
    torch.testing.assert_close(compiled(x, compiled_with), module(x, compiled_with))
    with pytest.raises(
        InputError, match=re.escape(f"argument 1 is {called_with!r} ({type(called_with).__name__})")
    ):
        compiled(x, called_with)


# ---- in-place writes (CPU part of the GPU suite's test_writes_gpu.py) --------------------------------------
class _CountsCalls(torch.nn.Module):
    """Writes its buffer and its argument in place; the argument's write and the output read the buffer."""

    def __init__(self):
        super().__init__()
        self.register_buffer("calls", torch.zeros(1, dtype=torch.int64))

    def forward(self, x):
        self.calls.add_(1)
        x.add_(self.calls)
        return x * 2 + self.calls


@pytest.mark.parametrize("batch", [1, 2, 5])
def test_first_call_writes_model_state_once(batch):
    """The first call (which traces: on a 2-row copy at batch 1, on the call's own tensors above) writes the
    model's state and its arguments once, like eager; so do later calls."""
    torch._dynamo.reset()
    model, twin = _CountsCalls(), _CountsCalls()
    compiled = pieceworks.compile(
        model, CompilationConfig(compiler="eager", cudagraph_mode=CUDAGraphMode.NONE)
    )
    for call, rows in enumerate([batch, batch + 1, 1]):
        x = torch.randn(rows, 3)
        x_eager = x.clone()
        torch.testing.assert_close(compiled(x), twin(x_eager))
        assert int(model.calls) == call + 1, (
            f"call {call} wrote the model's buffer {int(model.calls) - call} times"
        )
        torch.testing.assert_close(x, x_eager)  # the argument written once, with the state of this call
