"""Compile cold, warm, and warm on a new host: ToyLlama (12 layers), each start in a fresh process.

Runs on the machine's serving device (CUDA where torch sees it, else the CPU) through
`pieceworks.harness.scenario.run_scenario` (Inductor, mode NONE, batches 1, 7, 64, 300):
- cold: empty pieceworks cache, empty Inductor cache;
- warm: the cold run's pieceworks cache and Inductor cache (a restart on the same host);
- warm_new_host: the cold run's pieceworks cache, an empty Inductor cache (the pieceworks cache copied to a new
  host, or a host whose Inductor cache was cleared).
A host is a temporary folder (`TMPDIR`, under which Inductor keeps its default cache) and `TORCHINDUCTOR_CACHE_DIR`
is unset, as on a machine nobody configured: pieceworks then keeps Inductor's cache inside its own, which is what a
new host inherits. (Naming a `TORCHINDUCTOR_CACHE_DIR` is the user's choice, which pieceworks leaves alone: a new
host with an empty one rebuilds every kernel. Until 2026-11-23 this benchmark did that by mistake, so its
warm_new_host rows measured a rebuild: 0.42x cold on the H100, 0.92x on a CPU.)
Tracked: seconds of the first call (trace + compile or load), seconds of the whole process (imports included),
Inductor compiles and artifacts loaded. Details (`compile.json`, for the report): the first call's seconds inside
the pieceworks backend and, of those, compiling or loading the pieces (`Runtime.build_seconds`); the rest of the
first call is Dynamo's trace, its guards and one run of the model. Targets (report): warm 0 compiles and <= 10%
of cold, also on a new host.
"""

from __future__ import annotations

import os
import tempfile
import time

from . import _shared

SCENARIOS = ["cold", "warm", "warm_new_host"]
LAYERS = 12


def measure() -> dict:
    import torch

    from pieceworks.harness.scenario import run_scenario

    device = "cuda" if torch.cuda.is_available() else "cpu"
    pieceworks_cache = tempfile.mkdtemp(prefix="pieceworks-bench-compile-")
    hosts = {"cold": tempfile.mkdtemp(prefix="pieceworks-bench-host-")}  # each host's TMPDIR
    hosts["warm"] = hosts["cold"]
    hosts["warm_new_host"] = tempfile.mkdtemp(prefix="pieceworks-bench-host-")
    results: dict = {}
    for scenario in SCENARIOS:
        _shared.progress(f"compile {scenario} on {device} (a fresh process)")
        start = time.perf_counter()
        report = run_scenario(
            "--model", "toy_llama", "--layers", str(LAYERS), "--cache-dir", pieceworks_cache, "--device", device,
            "--batches", "1,7,64,300", env={"TMPDIR": hosts[scenario]}, unset=("TORCHINDUCTOR_CACHE_DIR",),
            timeout=500,
        )
        counters = report["counters"]
        results[scenario] = {
            "first_call_seconds": report["first_call_s"],
            "process_seconds": time.perf_counter() - start,
            "inductor_compiles": counters["num_inductor_compiles"],
            "artifacts_loaded": counters["num_compiled_artifacts_loaded"],
            "max_rel_error": report["max_rel_error"],
            "backend_seconds": report["build_seconds"].get("backend"),
            "compile_or_load_seconds": report["build_seconds"].get("compile"),
        }
        _shared.progress(f"compile {scenario}: {results[scenario]}")
    _shared.write_details("compile", {"device": device, "layers": LAYERS, "entries": results,
                                      "pieceworks_cache": os.path.basename(pieceworks_cache)})
    return results


class CompileStart:
    params = [SCENARIOS]
    param_names = ["start"]
    timeout = 900

    def setup_cache(self):
        return measure()

    def setup(self, cache, start):
        _shared.check(cache[start])

    def track_first_call_seconds(self, cache, start):
        return cache[start]["first_call_seconds"]

    track_first_call_seconds.unit = "seconds"

    def track_process_seconds(self, cache, start):
        return cache[start]["process_seconds"]

    track_process_seconds.unit = "seconds"

    def track_inductor_compiles(self, cache, start):
        return cache[start]["inductor_compiles"]

    track_inductor_compiles.unit = "compiles"

    def track_artifacts_loaded(self, cache, start):
        return cache[start]["artifacts_loaded"]

    track_artifacts_loaded.unit = "artifacts"
