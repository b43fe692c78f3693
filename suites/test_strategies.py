"""Every hypothesis strategy of `pieceworks.harness.testing.strategies` (and the suites' own,
`suites.helpers`) reaches its boundary cases.

A strategy that never draws batch 1, the largest capture size, a size above it, an empty index or a splitting
op at either end of a program would let every property pass while testing less than it claims. Each case asks
hypothesis' own `find` for a draw at one boundary (deterministic: a fixed seed, no example database).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import Phase, find, settings

from pieceworks.harness.testing import strategies
from suites.helpers import mismatches, signatures

# found, not shrunk
SETTINGS = settings(max_examples=3000, database=None, deadline=None, phases=[Phase.generate])


def reaches(strategy, condition) -> None:
    find(strategy, condition, settings=SETTINGS, random=random.Random(0))  # NoSuchExample fails the test


def _splits(program, where: int) -> bool:
    instructions, _ = program
    return instructions[where][0] in strategies.SPLITTING


PROGRAM_BOUNDARIES = {
    "no splitting op": lambda p: not any(ins[0] in strategies.SPLITTING for ins in p[0]),
    "splitting op first": lambda p: _splits(p, 0),
    "splitting op last": lambda p: _splits(p, -1),
    "splitting ops only": lambda p: all(ins[0] in strategies.SPLITTING for ins in p[0]),
    "in-place write to an input": lambda p: any(ins[0] == "inplace" and ins[1] < 2 for ins in p[0]),
    "two-output op": lambda p: any(ins[0] == "pair" for ins in p[0]),
    "an input returned": lambda p: 0 in p[1] or 1 in p[1],
    "longest": lambda p: len(p[0]) >= 10,
}


@pytest.mark.parametrize("boundary", list(PROGRAM_BOUNDARIES))
def test_programs_reach(boundary):
    reaches(strategies.programs(), PROGRAM_BOUNDARIES[boundary])


SIZE_BOUNDARIES = {
    "capture size 1": (lambda: strategies.capture_sizes(max_size=64), lambda s: 1 in s),
    "the largest capture size": (lambda: strategies.capture_sizes(max_size=64), lambda s: 64 in s),
    "one capture size": (lambda: strategies.capture_sizes(), lambda s: len(s) == 1),
    "most capture sizes": (lambda: strategies.capture_sizes(max_count=12), lambda s: len(s) == 12),
    "no compile range endpoint": (lambda: strategies.compile_ranges(), lambda r: r == []),
    "range endpoint 1": (lambda: strategies.compile_ranges(max_tokens=512), lambda r: 1 in r),
    "range endpoint max_tokens": (lambda: strategies.compile_ranges(max_tokens=512), lambda r: 512 in r),
    "batch 1": (lambda: strategies.batch_sequences(max_size=64), lambda b: 1 in b),
    "batch at the largest size": (lambda: strategies.batch_sequences(max_size=64), lambda b: 64 in b),
    "batch above the largest size": (lambda: strategies.batch_sequences(max_size=64), lambda b: max(b) > 64),
    "the largest batch": (lambda: strategies.batch_sequences(max_size=64, beyond=16), lambda b: 80 in b),
    "one size repeated": (lambda: strategies.batch_sequences(), lambda b: len(b) > 1 and len(set(b)) == 1),
    "descending batches": (
        lambda: strategies.batch_sequences(),
        lambda b: len(set(b)) > 2 and b == sorted(b, reverse=True),
    ),
}


@pytest.mark.parametrize("boundary", list(SIZE_BOUNDARIES))
def test_sizes_reach(boundary):
    strategy, condition = SIZE_BOUNDARIES[boundary]
    reaches(strategy(), condition)


CACHE_BOUNDARIES = {
    "empty index": (strategies.index_entries, lambda e: e == {}),
    "empty entry name": (strategies.index_entries, lambda e: "" in e),
    "zero-byte artifact": (strategies.index_entries, lambda e: any(v["bytes"] == 0 for v in e.values())),
    "truncated to nothing": (strategies.corruptions, lambda d: d == ("truncate", 0)),
    **{
        f"damage {kind}": (strategies.corruptions, lambda d, kind=kind: d[0] == kind)
        for kind in ("truncate", "digit", "flip", "garbage", "empty", "version")
    },
}


@pytest.mark.parametrize("boundary", list(CACHE_BOUNDARIES))
def test_cache_damage_reaches(boundary):
    strategy, condition = CACHE_BOUNDARIES[boundary]
    reaches(strategy(), condition)


SIGNATURE = (("tensor", "float32", (2, 3)), ("tensor", "int64", ()), ("value", 2))


@pytest.mark.parametrize("kind", ["trailing", "rank", "dtype", "device", "count", "value", "kind", "batch"])
def test_mismatches_reach_every_kind(kind):
    reaches(mismatches(SIGNATURE), lambda m: m[0] == kind)


CALL_BOUNDARIES = {
    "one tensor and nothing else": (signatures, lambda s: len(s) == 1),
    "most arguments": (lambda: signatures(max_args=4), lambda s: len(s) == 4),
    "a bool tensor": (signatures, lambda s: any(a[0] == "tensor" and a[1] == "bool" for a in s)),
    "a 0-trailing-dim tensor": (signatures, lambda s: any(a[0] == "tensor" and a[2] == () for a in s)),
    "a plain True": (signatures, lambda s: any(a[0] == "value" and a[1] is True for a in s)),
    "a bare output leaf": (
        strategies.output_structures,
        lambda o: o[0] == "value" if isinstance(o, tuple) and o and isinstance(o[0], str) else False,
    ),
    "outputs nested three deep": (strategies.output_structures, lambda o: _depth(o) >= 3),
    "a dict of outputs": (lambda: strategies.output_structures(dicts=True), lambda o: _has(o, dict)),
    "an unbatched output": (
        lambda: strategies.output_structures(unbatched=True),
        lambda o: "weight" in repr(o),
    ),
}


def _depth(o) -> int:
    if isinstance(o, dict):
        return 1 + max(map(_depth, o.values()))
    if isinstance(o, list) or (isinstance(o, tuple) and o and not isinstance(o[0], str)):
        return 1 + max(map(_depth, o))
    return 0


def _has(o, kind) -> bool:
    if isinstance(o, kind):
        return True
    children = o.values() if isinstance(o, dict) else o if isinstance(o, (list, tuple)) else ()
    return any(_has(c, kind) for c in children if not isinstance(c, str))


@pytest.mark.parametrize("boundary", list(CALL_BOUNDARIES))
def test_calls_and_outputs_reach(boundary):
    strategy, condition = CALL_BOUNDARIES[boundary]
    reaches(strategy(), condition)


def test_profiles_are_loaded_once_so_a_later_conftest_keeps_the_chosen_one():
    """pytest loads --hypothesis-profile after the first conftests; a conftest imported later (the conformance
    suite's parents, in a --pyargs run) calls register_profiles again, which must not load the default
    again."""
    chosen = settings.get_current_profile_name()
    try:
        settings.load_profile("nightly")
        strategies.register_profiles()
        assert settings.get_current_profile_name() == "nightly" and settings.default.max_examples == 1000
    finally:
        settings.load_profile(chosen)
