"""Side-by-side timing (`harness.measure.timing.interleaved_cuda_time_us`) on a fake clock: CUDA events
replaced by a clock the timed callables advance, so the test runs on a CPU and knows the true costs."""

from __future__ import annotations

import pytest
import torch

from pieceworks.harness.measure import timing


class _Clock:
    """Milliseconds of fake time; calls inside [spell_start, spell_end) cost `spell` times more (a busy
    host)."""

    def __init__(self, spell_start: float, spell_end: float, spell: float) -> None:
        self.now = 0.0
        self.window = (spell_start, spell_end)
        self.spell = spell

    def work(self, cost_ms: float) -> None:
        slow = self.window[0] <= self.now < self.window[1]
        self.now += cost_ms * (self.spell if slow else 1.0)


def _fake_events(monkeypatch, clock: _Clock) -> None:
    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.at = None

        def record(self) -> None:
            self.at = clock.now

        def elapsed_time(self, end: Event) -> float:
            return end.at - self.at

    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)


def test_a_slow_spell_falls_on_both_sides_of_a_ratio(monkeypatch):
    """B costs twice A. A spell that triples every cost from the moment A's samples would have ended, had they
    been taken first, to the end of the run: timed in rotating rounds, B / A is still 2 (the spell covers both
    alike); timed one after the other it would read 6."""
    clock = _Clock(spell_start=280.0, spell_end=float("inf"), spell=3.0)
    _fake_events(monkeypatch, clock)
    fns = {"a": lambda: clock.work(1.0), "b": lambda: clock.work(2.0)}
    result = timing.interleaved_cuda_time_us(fns, warmup=20, reps=200, rounds=10)
    ratio = timing.ratio_over_rounds(result["b"], result["a"])
    assert ratio["rounds"] == 10 and len(result["a"]["round_medians_us"]) == 10
    assert ratio["median"] == pytest.approx(2.0), ratio
    assert result["a"]["median_us"] in (1000.0, 3000.0) and result["b"]["median_us"] in (2000.0, 6000.0)


# ---- the numbers themselves: a wrong timer or memory reading fails these -----------------------------------
def test_summary_and_ratio_are_exact_on_known_samples():
    assert timing.summary_us([1.0, 2.0, 3.0, 4.0, 5.0]) == {
        "median_us": 3.0,
        "p25_us": 1.5,
        "p75_us": 4.5,
        "iqr_us": 3.0,
    }
    ratio = timing.ratio_over_rounds(
        {"round_medians_us": [2.0, 4.0, 9.0]}, {"round_medians_us": [1.0, 1.0, 3.0]}
    )
    assert ratio == {"median": 3.0, "min": 2.0, "max": 4.0, "rounds": 3}


def test_a_profile_sums_own_time_by_whose_code_runs_a_builtin_by_its_callers(tmp_path):
    """A built-in function has no file: its own time goes to the owners of the code that called it, as it was
    spent under each caller. Exactly, on cProfile's stats: hashing called from two functions of a package of
    an installation is that package's time (both callers' shares), hashing called from the caller's own code
    is "other". Then on a real profile (40 hashes under the package, 2 under the test): both owners appear,
    the package's the larger (a margin of 20x: a loaded machine cannot reverse it)."""
    import hashlib
    import importlib.util

    from pieceworks.harness.measure.profile import host_profile, own_time_by_owner, owner

    path = tmp_path / "site-packages" / "hashpkg" / "work.py"
    spin, spin_again, both = (str(path), 3, "spin"), (str(path), 7, "spin_again"), (__file__, 90, "both")
    builtin_callers = {
        spin: (20, 20, 0.020, 0.020),
        spin_again: (20, 20, 0.024, 0.024),
        both: (2, 2, 0.003, 0.003),
    }
    stats = {
        ("~", 0, "<built-in method _hashlib.openssl_sha256>"): (42, 42, 0.047, 0.047, builtin_callers),
        spin: (1, 1, 0.001, 0.021, {both: (1, 1, 0.001, 0.021)}),
        spin_again: (1, 1, 0.002, 0.026, {both: (1, 1, 0.002, 0.026)}),
        both: (1, 1, 0.004, 0.054, {}),
    }
    assert owner(str(path)) == "hashpkg" and owner(__file__) == "other"
    found = own_time_by_owner(stats)
    assert found == pytest.approx({"hashpkg": 0.020 + 0.024 + 0.001 + 0.002, "other": 0.003 + 0.004})

    path.parent.mkdir(parents=True)
    body = "    for _ in range(20):\n        hashlib.sha256(data).digest()\n"
    path.write_text(f"import hashlib\n\ndef spin(data):\n{body}\ndef spin_again(data):\n{body}")
    spec = importlib.util.spec_from_file_location("hashpkg_work", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    data = bytes(1 << 20)

    def run_both():
        module.spin(data)
        module.spin_again(data)
        for _ in range(2):
            hashlib.sha256(data).digest()

    owners = host_profile(run_both)["owners"]
    assert owners["hashpkg"] > owners["other"] > 0, owners


def test_host_time_measures_the_time_a_call_takes():
    import time

    slept = timing.host_time_us(lambda: time.sleep(0.002), warmup=1, reps=5, calls=2)
    assert 2000 <= slept["median_us"] < 8000, slept
    assert timing.host_time_us(lambda: None, warmup=1, reps=5)["median_us"] < 100


def _gpu_work(device, ms: float = 5.0):
    """A callable that keeps the GPU busy about `ms` milliseconds (a chain of matmuls), and its wall time per
    call measured with a synchronize on each side."""
    import time

    a = torch.randn(2048, 2048, device=device)
    torch.cuda.synchronize()
    start = time.perf_counter()
    a @ a
    torch.cuda.synchronize()
    repeats = max(1, int(ms / 1e3 / max(time.perf_counter() - start, 1e-6)))

    def work():
        for _ in range(repeats):
            a @ a

    for _ in range(3):
        work()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(5):
        work()
    torch.cuda.synchronize()
    return work, (time.perf_counter() - start) / 5 * 1e6


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_gpu_timers_wait_for_the_device(cuda):
    """CUDA events and the synchronized clock report the kernels' time (about the synchronized wall time of
    the work), not the microseconds it takes to launch them."""
    work, wall_us = _gpu_work(cuda)
    timed = timing.cuda_time_us(work, warmup=2, reps=10)["median_us"]
    assert 0.7 * wall_us <= timed <= 1.3 * wall_us, (timed, wall_us)
    start = timing.synchronized_clock()
    work()
    elapsed_us = (timing.synchronized_clock() - start) * 1e6
    assert elapsed_us >= 0.7 * wall_us, (elapsed_us, wall_us)


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_memory_readings_see_a_known_allocation(cuda):
    """256 MiB allocated shows in the allocator and device readings; a graph whose output is 64 MiB holds at
    least that much in its pool, and the pool reading counts only that pool."""
    from pieceworks.harness.measure import memory

    # cached blocks of earlier tests would serve the allocation without a new segment
    torch.cuda.empty_cache()
    before = memory.memory_state()
    block = torch.empty(256 * 2**20, dtype=torch.uint8, device=cuda)
    after = memory.memory_state()
    assert after["allocated"] - before["allocated"] == 256 * 2**20
    assert after["reserved"] - before["reserved"] >= 256 * 2**20
    assert after["device_used"] - before["device_used"] >= 256 * 2**20 * 0.99, (before, after)
    del block
    x = torch.ones(16 * 2**20, device=cuda)  # 64 MiB of float32
    pool = torch.cuda.graph_pool_handle()
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        x * 2  # warm-up outside the graph
        with torch.cuda.graph(graph, pool=pool, stream=stream):
            y = x * 2
    torch.cuda.current_stream().wait_stream(stream)
    assert 64 * 2**20 <= memory.pool_bytes(pool) < 2 * 64 * 2**20 + 2 * 2**20, memory.pool_bytes(pool)
    assert memory.pool_bytes(torch.cuda.graph_pool_handle()) == 0
    del graph, y
