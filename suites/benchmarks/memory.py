"""GPU memory and capture time vs the number of captured sizes, pieceworks PIECEWISE, FULL and
FULL_AND_PIECEWISE and the compiler-free peers (`PEERS`), bf16: ToyLlama (`CaptureMemory`), the
Llama-3.2-1B-shaped model (`CaptureMemoryLlama1B`) and the whole Llama-3.1-8B-shaped one, 32 layers
(`CaptureMemoryLlama8B`).

For 1, 8 and 51 captured sizes (the largest n of vLLM's 51 sizes up to 512, so n=1 is the largest size alone)
one compiled model captures them all into its one pool. Before each capture, `CompiledModel.estimate_capture`
estimates that pool (its own sample, freed before the capture). Readings around the capture phase:
- pool MiB: the allocator's segments of the model's graph pool (`memory.pool_bytes`), and the estimate's MiB;
- allocator reserved delta MiB;
- NVML device-used delta MiB (device-wide: also driver-side graph memory, and any other process's changes);
- capture seconds (the capture phase, as `CompiledModel.capture` reports it).
Each peer (`harness.adapters`, where installed) is built for the same sizes on the same model in the same
process: its capture seconds (warm-up runs included, as its adapter times them) and its pool MiB.
Then the capture of all sizes once more under cProfile (`profile.host_profile`: where its host time goes; its
seconds include the profiler's overhead), for the details file.
Unshared baseline: the same sizes captured one pool per size, all alive together (largest first): the sum of
their pool MiB, and the reserved and NVML deltas since the first of them was captured.

Cost: one trace and compile per mode. Every row, and every pool of the baseline, is captured by that one
model: `Runtime.reset()` drops its graphs (or, for the baseline, hands them to a list that keeps them alive)
and starts a fresh pool. The code and its fusions are the same for every size (the piece code does not depend
on the capture sizes), so pool bytes are what a model per size would capture. The capture stream and its
warm-up MemPool (the stream's cuBLAS workspace) are the model's, made once by a throw-away capture before the
first reading: deltas leave them out, for the shared rows and the baseline alike (a model per size would add
one workspace per model).
"""

from __future__ import annotations

from . import _shared
from ._shared import GPU_TIMEOUT

MODES = ["PIECEWISE", "FULL", "FULL_AND_PIECEWISE"]
PEERS = ["meta-pcg", "breakable"]
SIZE_COUNTS = [1, 8, 51]
MiB = 2**20


def _delta(after: dict, before: dict, key: str) -> float | None:
    if after.get(key) is None or before.get(key) is None:
        return None
    return (after[key] - before[key]) / MiB


def _compiled(model, make_inputs, splitting_ops, mode: str, sizes: list[int]):
    import pieceworks

    config = pieceworks.CompilationConfig(
        splitting_ops=splitting_ops, cudagraph_mode=mode, cudagraph_capture_sizes=sizes
    )
    compiled = pieceworks.compile(model, config)
    compiled(*make_inputs(3))
    return compiled


def _settle() -> None:
    """Free the graphs just dropped and the allocator's free blocks (Dynamo is left alone: the model is
    traced)."""
    import gc

    import torch

    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def measure(model_name: str = "toy_llama") -> dict:
    """`{(mode, sizes): readings}` of `model_name` (a `_shared.model_and_inputs` name) and the NVML status, or
    `{"skip": reason}`; the details file is `memory` for ToyLlama, `memory_<model_name>` for the others."""
    detail = "memory" if model_name == "toy_llama" else f"memory_{model_name}"
    reason = _shared.cuda_skip_reason()
    if reason is not None:
        _shared.write_details(detail, {"skip": reason})
        return {"skip": reason}
    _shared.run_dir()
    import torch

    from pieceworks import default_capture_sizes
    from pieceworks.harness.measure.memory import memory_state, nvml_status, pool_bytes
    from pieceworks.harness.measure.profile import host_profile

    model, make_inputs, splitting_ops = _shared.model_and_inputs(model_name, "bfloat16")
    all_sizes = default_capture_sizes(_shared.MAX_CAPTURE)
    results: dict = {}
    capture_profiles: dict = {}
    for mode in MODES:
        _shared.progress(f"memory {model_name} {mode}: one trace and compile")
        _shared.release()
        compiled = _compiled(model, make_inputs, splitting_ops, mode, all_sizes)
        runtime = compiled.runtime
        compiled.capture(
            [all_sizes[0]]
        )  # the capture stream and its warm-up MemPool: made once, outside readings
        for count in SIZE_COUNTS:
            sizes = all_sizes[-count:]
            _shared.progress(f"memory {model_name} {mode}: {count} sizes in one pool")
            runtime.reset()
            _settle()
            estimate = compiled.estimate_capture(sizes)
            _settle()
            before = memory_state()
            report = compiled.capture(sizes)
            after = memory_state()
            pool = pool_bytes(runtime.pool.handle)
            results[(mode, count)] = {
                "pool_mib": pool / MiB,
                "estimate_mib": estimate["pool_bytes"] / MiB,
                "estimate_error_percent": 100 * (estimate["pool_bytes"] - pool) / pool if pool else None,
                "estimate_seconds": estimate["seconds"],
                "reserved_delta_mib": _delta(after, before, "reserved"),
                "nvml_delta_mib": _delta(after, before, "nvml_used"),
                "device_used_delta_mib": _delta(after, before, "device_used"),
                "capture_seconds": report["seconds"],
                "graphs": report["graphs"],
            }
        runtime.reset()
        _settle()
        _shared.progress(
            f"memory {model_name} {mode}: the {len(all_sizes)}-size capture again, under cProfile"
        )
        capture_profiles[mode] = host_profile(lambda: compiled.capture(all_sizes))  # noqa: B023, F821 - called within this iteration, before `del compiled`
        _shared.progress(f"memory {model_name} {mode}: unshared baseline, one pool per size, all kept alive")
        runtime.reset()
        _settle()
        pools = []  # (pool handle, that size's graphs): kept alive together
        start = memory_state()
        for size in reversed(all_sizes):  # largest first, as a shared pool would capture them
            compiled.capture([size])
            pools.append(
                (runtime.pool.handle, [runtime.replay_for(s, False) for s in runtime.captured_sizes])
            )
            runtime.reset()
            if len(pools) in SIZE_COUNTS:
                now = memory_state()
                results[(mode, len(pools))].update(
                    unshared_pool_mib=sum(pool_bytes(handle) for handle, _ in pools) / MiB,
                    unshared_reserved_delta_mib=_delta(now, start, "reserved"),
                    unshared_nvml_delta_mib=_delta(now, start, "nvml_used"),
                )
        del pools, compiled, runtime
    from pieceworks.harness.adapters import IMPLEMENTATIONS

    for name in PEERS:
        reason = IMPLEMENTATIONS[name].unavailable_reason()
        for count in SIZE_COUNTS:
            if reason is not None:
                results[(name, count)] = {"skip": reason}
                continue
            _shared.progress(f"memory {model_name} {name}: {count} sizes")
            _shared.release()
            built = IMPLEMENTATIONS[name].build(model, make_inputs, all_sizes[-count:], splitting_ops)
            torch.cuda.synchronize()
            results[(name, count)] = {
                "pool_mib": pool_bytes(built.pool) / MiB,
                "capture_seconds": built.capture_seconds,
            }
            del built
    _shared.release()
    _shared.write_details(
        detail,
        {
            "model": model_name,
            "dtype": "bfloat16",
            "capture_sizes": all_sizes,
            "nvml": nvml_status(),
            "capture_profiles": capture_profiles,
            "entries": {f"{m}|{n}": v for (m, n), v in results.items()},
        },
    )
    return {**results, "nvml": nvml_status()}  # the NVML status: why a reading is missing, if one is


class CaptureMemory:
    """Per (pieceworks mode or peer, number of captured sizes); see the module docstring for what each reading
    covers."""

    params = [MODES + PEERS, SIZE_COUNTS]
    param_names = ["mode", "sizes"]
    timeout = GPU_TIMEOUT

    def setup_cache(self):
        return measure()

    def setup(self, cache, mode, sizes):
        _shared.check(cache)
        _shared.check(cache[(mode, sizes)])

    def _reading(self, cache, mode, sizes, key):
        value = cache[(mode, sizes)].get(key)
        if value is None:
            raise _shared.Skip(
                f"{key} is not read for {mode}" if mode in PEERS else f"{key} not read here: {cache['nvml']}"
            )
        return value

    def track_pool_mib(self, cache, mode, sizes):
        return self._reading(cache, mode, sizes, "pool_mib")

    track_pool_mib.unit = "MiB"

    def track_estimate_mib(self, cache, mode, sizes):
        return self._reading(cache, mode, sizes, "estimate_mib")

    track_estimate_mib.unit = "MiB"

    def track_reserved_delta_mib(self, cache, mode, sizes):
        return self._reading(cache, mode, sizes, "reserved_delta_mib")

    track_reserved_delta_mib.unit = "MiB"

    def track_nvml_used_delta_mib(self, cache, mode, sizes):
        return self._reading(cache, mode, sizes, "nvml_delta_mib")

    track_nvml_used_delta_mib.unit = "MiB"

    def track_unshared_pool_mib(self, cache, mode, sizes):
        return self._reading(cache, mode, sizes, "unshared_pool_mib")

    track_unshared_pool_mib.unit = "MiB"

    def track_unshared_reserved_delta_mib(self, cache, mode, sizes):
        return self._reading(cache, mode, sizes, "unshared_reserved_delta_mib")

    track_unshared_reserved_delta_mib.unit = "MiB"

    def track_unshared_nvml_used_delta_mib(self, cache, mode, sizes):
        return self._reading(cache, mode, sizes, "unshared_nvml_delta_mib")

    track_unshared_nvml_used_delta_mib.unit = "MiB"

    def track_capture_seconds(self, cache, mode, sizes):
        return self._reading(cache, mode, sizes, "capture_seconds")

    track_capture_seconds.unit = "seconds"


class CaptureMemoryLlama1B(CaptureMemory):  # its own setup_cache: asv keys the cache by where it is defined
    def setup_cache(self):
        return measure("llama_1b")


class CaptureMemoryLlama8B(CaptureMemory):  # its own setup_cache: asv keys the cache by where it is defined
    def setup_cache(self):
        return measure("llama_8b")
