"""Compile cold, warm, and warm on a new host: ToyLlama (12 layers), each start in a fresh process.

Runs on the machine's serving device (CUDA where torch sees it, else the CPU) through
`pieceworks.harness.warm_start.measure` (its module doc says what each start is and what is recorded; the same
measurement runs alone as `python -m pieceworks.harness.warm_start`). (Naming a `TORCHINDUCTOR_CACHE_DIR` is the
user's choice, which pieceworks leaves alone: a new host with an empty one rebuilds every kernel, so every start here
unsets it and keeps Inductor's default cache under its host's `TMPDIR`.)
Tracked: seconds of the first call (trace + compile or load), seconds of the whole process (imports included),
Inductor compiles and artifacts loaded. Details (`compile.json`, for the report): the first call's seconds inside
the pieceworks backend and, of those, compiling or loading the pieces (`CompiledGraph.build_seconds`); the rest of the
first call is Dynamo's trace, its guards and one run of the model. Targets (report): warm 0 compiles and <= 10%
of cold, also on a new host."""

from __future__ import annotations

from . import _shared

SCENARIOS = ["cold", "warm", "warm_new_host"]  # pieceworks.harness.warm_start.STARTS
LAYERS = 12


def measure() -> dict:
    import torch

    from pieceworks.harness.warm_start import measure as warm_start

    device = "cuda" if torch.cuda.is_available() else "cpu"
    results = warm_start(device, LAYERS, progress=_shared.progress)
    _shared.write_details("compile", {"device": device, "layers": LAYERS, "entries": results})
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
