"""Host overhead of the pieceworks runtime on a CPU: per forward and per piece (eager compiler, mode NONE).

The same path as suites/test_host_overhead.py's CPU variant (pytest-benchmark), kept here so that the CPU
benchmark history (and the CI gate) sees it: `pieceworks.harness.measure.breakdown` records a forward's
pieces, times their work alone with a host clock (torch on one thread) and subtracts it, in rounds: the
overhead per piece is the median over rounds, and its range over rounds is tracked beside it. Models: the
embedded tiny ToyLlama (2 layers, hidden 16) and ToyLlama (12 layers). The GPU variant (graph replays
subtracted) is the pytest-benchmark suite, run on the GPU.
"""

from __future__ import annotations

from . import _shared

MODELS = ["tiny", "toy_llama"]


def measure() -> dict:
    import torch

    import pieceworks
    from pieceworks.harness.measure import breakdown
    from pieceworks.harness.measure.timing import host_time_us
    from pieceworks.harness.models import toy as models

    torch.set_num_threads(1)  # host overhead, not the thread pool's: one thread keeps the GEMMs quiet
    results = {}
    for name in MODELS:
        config = (
            models.ToyLlamaConfig(hidden_size=16, mlp_size=32, vocab_size=16, num_layers=2)
            if name == "tiny"
            else models.ToyLlamaConfig(num_layers=12)
        )
        torch.manual_seed(0)
        model = models.ToyLlama(config)
        compiled = pieceworks.compile(
            model,
            pieceworks.CompilationConfig(
                splitting_ops=models.SPLITTING_OPS,
                compiler="eager",
                cudagraph_mode="NONE",
                cache_enabled=False,
            ),
        )
        args = models.toy_llama_inputs(4, config, seed=1)
        with torch.no_grad():
            compiled(*args)
            _, work = breakdown.record(compiled, args)
            results[name] = breakdown.measure(
                lambda: compiled(*args),  # noqa: B023 - measure() calls it within this iteration
                work,
                lambda fn: host_time_us(fn, warmup=5, reps=15, calls=5),
            )
        _shared.progress(f"host overhead (CPU) {name}: {results[name]}")
    _shared.write_details("host_overhead_cpu", {"entries": results})
    return results


class HostOverheadCPU:
    params = [MODELS]
    param_names = ["model"]
    timeout = 300

    def setup_cache(self):
        return measure()

    def track_forward_us(self, cache, model):
        return cache[model]["forward_us"]

    track_forward_us.unit = "us"

    def track_overhead_per_forward_us(self, cache, model):
        return cache[model]["overhead_us"]

    track_overhead_per_forward_us.unit = "us"

    def track_overhead_per_piece_us(self, cache, model):
        return cache[model]["overhead_per_piece_us"]

    track_overhead_per_piece_us.unit = "us"

    def track_overhead_per_piece_min_us(self, cache, model):
        return cache[model]["overhead_per_piece_range_us"][0]

    track_overhead_per_piece_min_us.unit = "us"

    def track_overhead_per_piece_max_us(self, cache, model):
        return cache[model]["overhead_per_piece_range_us"][1]

    track_overhead_per_piece_max_us.unit = "us"
