"""Mutants of the harness's clocks and memory readings."""

from __future__ import annotations

import time

import pytest
import torch

import pieceworks.harness.measure.memory as memory
import pieceworks.harness.measure.profile as profile
import pieceworks.harness.measure.timing as timing

from . import mutant

_TIMING = "suites/test_timing.py::"


@mutant(
    "side-by-side timing runs each callable's rounds one after the other",
    cpu=_TIMING + "test_a_slow_spell_falls_on_both_sides_of_a_ratio",
)
def timing_not_interleaved(mp: pytest.MonkeyPatch) -> None:
    original = timing.interleaved_cuda_time_us

    def one_after_another(fns, warmup=20, reps=200, rounds=10):
        return {
            name: original({name: fn}, warmup=warmup, reps=reps, rounds=rounds)[name]
            for name, fn in fns.items()
        }

    mp.setattr(timing, "interleaved_cuda_time_us", one_after_another)


@mutant(
    "the synchronized clock reads the time without waiting for the GPU",
    gpu=_TIMING + "test_gpu_timers_wait_for_the_device",
)
def clock_skips_the_device(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(timing, "synchronized_clock", time.perf_counter)


@mutant(
    "GPU calls timed with a host clock around their launches",
    gpu=_TIMING + "test_gpu_timers_wait_for_the_device",
)
def events_per_launch(mp: pytest.MonkeyPatch) -> None:
    def host_clock_samples(fn, reps, calls=1):  # a host clock around asynchronous launches
        samples = []
        for _ in range(reps):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples.append((time.perf_counter() - start) * 1e6 / calls)
        return samples

    mp.setattr(timing, "event_samples_us", host_clock_samples)


@mutant(
    "a pool's bytes count every graph pool's segments",
    gpu=_TIMING + "test_memory_readings_see_a_known_allocation",
)
def pool_reading_counts_every_pool(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(
        memory,
        "pool_bytes",
        lambda pool: sum(
            s["total_size"]
            for s in torch.cuda.memory_snapshot()
            if tuple(s.get("segment_pool_id", ())) != (0, 0)
        ),
    )


@mutant(
    "a profile's own time by owner puts a built-in function's time under no caller (it has no file)",
    cpu=_TIMING + "test_a_profile_sums_own_time_by_whose_code_runs_a_builtin_by_its_callers",
)
def builtin_time_unowned(mp: pytest.MonkeyPatch) -> None:
    def by_own_file(stats):
        found: dict[str, float] = {}
        for (path, _, _), (_, _, tottime, _, _) in stats.items():
            found[profile.owner(path)] = found.get(profile.owner(path), 0.0) + tottime
        return found

    mp.setattr(profile, "own_time_by_owner", by_own_file)


@mutant(
    "a profile's own time by owner counts a built-in function once per caller file (the last caller's share)",
    cpu=_TIMING + "test_a_profile_sums_own_time_by_whose_code_runs_a_builtin_by_its_callers",
)
def builtin_time_one_caller_a_file(mp: pytest.MonkeyPatch) -> None:
    def by_caller_file(stats):
        found: dict[str, float] = {}
        for (path, _, _), (_, _, tottime, _, callers) in stats.items():
            shares = (
                {key[0]: by[2] for key, by in callers.items()} if path == "~" and callers else {path: tottime}
            )
            for caller, spent in shares.items():
                found[profile.owner(caller)] = found.get(profile.owner(caller), 0.0) + spent
        return found

    mp.setattr(profile, "own_time_by_owner", by_caller_file)
