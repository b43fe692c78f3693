"""GPU latency per forward: implementation x batch size, one class per (model, dtype): ToyLlama and SillyModel
in bfloat16 and float32 (every registered implementation), and the realistic Llama models in bfloat16
(Llama-3.2-1B's shape and 4 layers of Llama-3.1-8B's, paged-KV attention as the splitting op;
`LLAMA_IMPLEMENTATIONS`).

Each class's `setup_cache` builds the implementations on one model (vLLM's 51 capture sizes up to 512 for
those that pad; the timed sizes themselves for those that do not), checks every output against the eager
model, and times batches 1, 2, 8, 64, 256 and 512 with CUDA events after 20 warm-up calls (200 samples: median
and interquartile range, in µs). All numbers of a class come from one process.

Side by side: the implementations in `SIDE_BY_SIDE` are all built first and then timed in rounds whose order
rotates (`timing.interleaved_cuda_time_us`: 10 rounds of 20 samples each), so a slow spell of a shared host
falls on all of them alike; the target ratios (PIECEWISE / Meta pcg, FULL / reduce-overhead) are the medians
of their per-round ratios, with the range over the rounds, in the details file. These are the implementations
whose built callable keeps working while others are built: after its build none of them enters Dynamo
(pieceworks calls its compiled graph directly, meta-pcg and eager never trace), and reduce-overhead, whose
build resets Dynamo, is built last. The others (`inductor`, and implementations a user adds through
$PIECEWORKS_IMPLEMENTATIONS, whose builds may reset Dynamo too) are built and timed one at a time before.

ToyLlama classes then profile eager, pieceworks PIECEWISE, Meta pcg, pieceworks FULL and reduce-overhead (both
sides of each target ratio) once per batch size, on the builds just timed, after every timing (torch.profiler:
which kernels dominate; written to the details file; a profiler session leaves CUPTI loaded, so no timing
follows one).
"""

from __future__ import annotations

import time
from typing import Any

from . import _shared
from ._shared import BATCHES, GPU_TIMEOUT, IMPLEMENTATIONS

REPS = 200
ROUNDS = 10
WARMUP = 20
# built in this order: reduce-overhead last (it resets Dynamo)
SIDE_BY_SIDE = [
    "eager",
    "pieceworks-none",
    "pieceworks-piecewise",
    "pieceworks-full",
    "pieceworks-full_and_piecewise",
    "meta-pcg",
    "breakable",
    "reduce-overhead",
]
PROFILED = ["eager", "pieceworks-piecewise", "meta-pcg", "breakable", "pieceworks-full", "reduce-overhead"]
RATIOS = {
    "PIECEWISE / meta-pcg": ("pieceworks-piecewise", "meta-pcg"),
    "PIECEWISE / breakable": ("pieceworks-piecewise", "breakable"),
    "PIECEWISE / FULL": ("pieceworks-piecewise", "pieceworks-full"),
    "FULL / reduce-overhead": ("pieceworks-full", "reduce-overhead"),
}
# The realistic models: pieceworks' graph modes and the field's peers (compiler-free breakable graphs,
# Inductor's graph partition, reduce-overhead), bf16.
LLAMA_IMPLEMENTATIONS = [
    "eager",
    "inductor-partition",
    "pieceworks-piecewise",
    "pieceworks-full",
    "breakable",
    "reduce-overhead",
]


def measure(model_name: str, dtype: str, implementations: list[str] = IMPLEMENTATIONS) -> dict:
    """`implementations` x batch sizes for one model and dtype: `{(impl, batch): {...}}` or
    `{"skip": ...}`."""
    reason = _shared.cuda_skip_reason()
    if reason is not None:
        _shared.write_details(f"latency_{model_name}_{dtype}", {"skip": reason})
        return {"skip": reason}
    _shared.run_dir()
    import torch

    from pieceworks import default_capture_sizes
    from pieceworks.harness.adapters import load_user_implementations, resolve
    from pieceworks.harness.measure.profile import kernel_profile
    from pieceworks.harness.measure.timing import cuda_time_us, interleaved_cuda_time_us, ratio_over_rounds

    load_user_implementations()
    model, make_inputs, splitting_ops = _shared.model_and_inputs(model_name, dtype)
    capture_sizes = default_capture_sizes(_shared.MAX_CAPTURE)
    results: dict = {}
    details: dict = {
        "model": model_name,
        "dtype": dtype,
        "capture_sizes": capture_sizes,
        "reps": REPS,
        "rounds": ROUNDS,
        "side_by_side": [],
        "builds_s": {},
        "entries": {},
        "ratios": {},
        "profiles": {},
    }

    def build(name: str) -> Any:
        """The built implementation, or None with its entries recorded as skipped or failed."""
        impl = resolve(name)
        reason = impl.unavailable_reason()
        if reason is not None:
            results.update({(name, b): {"skip": reason} for b in BATCHES})
            return None
        _shared.progress(f"latency {model_name} {dtype}: building {name}")
        start = time.perf_counter()
        try:
            built = impl.build(
                model, make_inputs, capture_sizes if impl.capabilities.padding else BATCHES, splitting_ops
            )
        except Exception as exc:  # noqa: BLE001 - one broken implementation must not hide the others
            results.update(
                {
                    (name, b): {"error": f"{name} failed to build: {type(exc).__name__}: {exc}"}
                    for b in BATCHES
                }
            )
            return None
        details["builds_s"][name] = time.perf_counter() - start
        return built

    def checked(name: str, built: Any, batch: int, inputs: tuple) -> bool:
        """One call compared with eager: records its error, or the failure; True if it can be timed."""
        try:
            expected = model(*inputs).float()
            got = built(*inputs).float()
            results[(name, batch)] = {
                "max_rel_error": float((got - expected).abs().max() / expected.abs().max().clamp_min(1e-30))
            }
            return True
        except Exception as exc:  # noqa: BLE001 - recorded as this entry's failure, the others go on
            results[(name, batch)] = {"error": f"{name} at batch {batch}: {type(exc).__name__}: {exc}"}
            return False

    def said(name: str) -> None:
        _shared.progress(
            f"latency {model_name} {dtype}: {name} "
            + " ".join(f"{b}:{results[(name, b)].get('median_us', float('nan')):.0f}us" for b in BATCHES)
        )

    alone = [n for n in implementations if n not in SIDE_BY_SIDE]
    together = [n for n in SIDE_BY_SIDE if n in implementations]
    with torch.no_grad():
        for name in alone:  # one build alive at a time
            _shared.release()
            built = build(name)
            if built is None:
                continue
            for batch in BATCHES:
                inputs = make_inputs(batch)
                if checked(name, built, batch, inputs):
                    results[(name, batch)].update(
                        cuda_time_us(lambda: built(*inputs), warmup=WARMUP, reps=REPS)  # noqa: B023, F821 - called within this iteration, before `del built`
                    )
            said(name)
            del built
        _shared.release()
        group = {name: b for name in together if (b := build(name)) is not None}
        details["side_by_side"] = list(group)
        for batch in BATCHES:
            inputs = make_inputs(batch)
            timed = {
                name: (lambda fn=fn: fn(*inputs))  # noqa: B023 - timed within this iteration
                for name, fn in group.items()
                if checked(name, fn, batch, inputs)
            }
            try:
                row = interleaved_cuda_time_us(timed, warmup=WARMUP, reps=REPS, rounds=ROUNDS)
            except Exception as exc:  # noqa: BLE001 - a CUDA error here poisons the rest of the batch
                for name in timed:
                    results[(name, batch)] = {"error": f"timing batch {batch}: {type(exc).__name__}: {exc}"}
                continue
            for name, timing in row.items():
                results[(name, batch)].update(timing)
            details["ratios"][str(batch)] = {
                label: ratio_over_rounds(row[a], row[b])
                for label, (a, b) in RATIOS.items()
                if a in row and b in row
            }
        for name in group:
            said(name)
        if model_name != "silly":  # after all timings: a profiler session leaves CUPTI loaded in the process
            for name in PROFILED:
                if name not in group:
                    continue
                _shared.progress(f"latency {model_name} {dtype}: profiling {name}")
                for batch in BATCHES:
                    inputs = make_inputs(batch)
                    try:
                        details["profiles"][f"{name}|{batch}"] = kernel_profile(
                            lambda: group[name](*inputs),  # noqa: B023, F821 - called within this iteration, before `del group`
                            calls=3,
                        )
                    except Exception as exc:  # noqa: BLE001 - a profiler failure must not lose the timings
                        details["profiles"][f"{name}|{batch}"] = {"error": f"{type(exc).__name__}: {exc}"}
        del group
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


class Llama1BBfloat16(_Latency):
    params = [LLAMA_IMPLEMENTATIONS, BATCHES]

    def setup_cache(self):
        return measure("llama_1b", "bfloat16", LLAMA_IMPLEMENTATIONS)


class Llama8B4LayersBfloat16(_Latency):
    params = [LLAMA_IMPLEMENTATIONS, BATCHES]

    def setup_cache(self):
        return measure("llama_8b_4l", "bfloat16", LLAMA_IMPLEMENTATIONS)
