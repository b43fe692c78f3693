"""GPU latency per forward: implementation x batch size, one class per (model, dtype).

Each class's `setup_cache` builds one implementation at a time on the same model (vLLM's 51 capture sizes up to
512 for implementations that pad; the timed sizes themselves for those that do not), checks its output against
the eager model, and times batches 1, 2, 8, 64, 256 and 512 with CUDA events after 20 warm-up calls (200
samples: median and interquartile range, in µs). ToyLlama classes then profile eager, pieceworks PIECEWISE, Meta
pcg, pieceworks FULL and reduce-overhead (both sides of each target ratio) once per batch size, after every timing
(torch.profiler: which kernels dominate; written to the details
file; a profiler session leaves CUPTI loaded, so no timing follows one). All numbers
of a class come from one process, so the report's ratios (PIECEWISE / Meta pcg, FULL / reduce-overhead) compare
numbers measured side by side.
"""

from __future__ import annotations

import time

from . import _shared
from ._shared import BATCHES, GPU_TIMEOUT, IMPLEMENTATIONS

REPS = 200
PROFILED = ["eager", "pieceworks-piecewise", "meta-pcg", "pieceworks-full", "reduce-overhead"]


def measure(model_name: str, dtype: str) -> dict:
    """All implementations x batch sizes for one model and dtype: `{(impl, batch): {...}}` or `{"skip": ...}`."""
    reason = _shared.cuda_skip_reason()
    if reason is not None:
        _shared.write_details(f"latency_{model_name}_{dtype}", {"skip": reason})
        return {"skip": reason}
    _shared.run_dir()
    import torch

    from pieceworks import default_capture_sizes
    from pieceworks.harness.implementations import load_user_implementations, resolve
    from pieceworks.harness.profile import kernel_profile
    from pieceworks.harness.timing import cuda_time_us

    load_user_implementations()
    model, make_inputs, splitting_ops = _shared.model_and_inputs(model_name, dtype)
    capture_sizes = default_capture_sizes(_shared.MAX_CAPTURE)
    results: dict = {}
    details: dict = {"model": model_name, "dtype": dtype, "capture_sizes": capture_sizes, "reps": REPS,
                     "builds_s": {}, "entries": {}, "profiles": {}}
    for name in IMPLEMENTATIONS:
        impl = resolve(name)
        reason = impl.unavailable_reason()
        if reason is not None:
            results.update({(name, b): {"skip": reason} for b in BATCHES})
            continue
        sizes = capture_sizes if impl.capabilities.padding else BATCHES
        _shared.progress(f"latency {model_name} {dtype}: building {name}")
        _shared.release()
        start = time.perf_counter()
        try:
            built = impl.build(model, make_inputs, sizes, splitting_ops)
        except Exception as exc:  # noqa: BLE001 - one broken implementation must not hide the others
            results.update({(name, b): {"error": f"{name} failed to build: {type(exc).__name__}: {exc}"}
                            for b in BATCHES})
            continue
        details["builds_s"][name] = time.perf_counter() - start
        with torch.no_grad():
            for batch in BATCHES:
                inputs = make_inputs(batch)
                try:
                    expected = model(*inputs).float()
                    got = built(*inputs).float()
                    error = float((got - expected).abs().max() / expected.abs().max().clamp_min(1e-30))
                    timing = cuda_time_us(lambda: built(*inputs), warmup=20, reps=REPS)
                    results[(name, batch)] = {**timing, "max_rel_error": error}
                except Exception as exc:  # noqa: BLE001 - recorded as this entry's failure, the others go on
                    results[(name, batch)] = {"error": f"{name} at batch {batch}: {type(exc).__name__}: {exc}"}
        _shared.progress(f"latency {model_name} {dtype}: {name} " + " ".join(
            f"{b}:{results[(name, b)].get('median_us', float('nan')):.0f}us" for b in BATCHES))
        del built
    _shared.release()
    if model_name == "toy_llama":  # after all timings: a profiler session leaves CUPTI loaded in the process
        for name in PROFILED:
            impl = resolve(name)
            if impl.unavailable_reason() is not None or "error" in results.get((name, BATCHES[0]), {}):
                continue
            _shared.progress(f"latency {model_name} {dtype}: profiling {name}")
            built = impl.build(model, make_inputs, capture_sizes if impl.capabilities.padding else BATCHES,
                               splitting_ops)
            with torch.no_grad():
                for batch in BATCHES:
                    inputs = make_inputs(batch)
                    try:
                        details["profiles"][f"{name}|{batch}"] = kernel_profile(lambda: built(*inputs), calls=3)
                    except Exception as exc:  # noqa: BLE001 - a profiler failure must not lose the timings
                        details["profiles"][f"{name}|{batch}"] = {"error": f"{type(exc).__name__}: {exc}"}
            del built
            _shared.release()
    details["entries"] = {f"{k[0]}|{k[1]}": v for k, v in results.items()}
    _shared.write_details(f"latency_{model_name}_{dtype}", details)
    return results


class _Latency:
    params = [IMPLEMENTATIONS, BATCHES]
    param_names = ["implementation", "batch"]
    timeout = GPU_TIMEOUT

    def setup(self, cache, implementation, batch):
        _shared.check(cache)
        _shared.check(cache[(implementation, batch)])

    def track_median_us(self, cache, implementation, batch):
        return cache[(implementation, batch)]["median_us"]

    track_median_us.unit = "us"

    def track_iqr_us(self, cache, implementation, batch):
        return cache[(implementation, batch)]["iqr_us"]

    track_iqr_us.unit = "us"


# One class per (model, dtype), each with its own setup_cache (asv keys the cache by where it is defined).
class ToyLlamaBfloat16(_Latency):
    def setup_cache(self):
        return measure("toy_llama", "bfloat16")


class ToyLlamaFloat32(_Latency):
    def setup_cache(self):
        return measure("toy_llama", "float32")


class SillyBfloat16(_Latency):
    def setup_cache(self):
        return measure("silly", "bfloat16")


class SillyFloat32(_Latency):
    def setup_cache(self):
        return measure("silly", "float32")
