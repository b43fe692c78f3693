"""Cold, warm, and warm on a new host: ToyLlama compiled in fresh processes, where each first call's time goes.

`python -m pieceworks.harness.warm_start [--device cuda] [--layers 12] [--again] [--capture] [--out F.json]`; the
compile benchmark runs the same `measure`. Each start is one `pieceworks.harness.scenario` process (Inductor, mode
NONE, or PIECEWISE with every default size captured after the first call: `--capture`; batches 1, 7, 64, 300), all
with one pieceworks cache:
- cold: empty pieceworks cache, empty Inductor cache;
- warm: the cold run's pieceworks cache and Inductor cache (a restart on the same host);
- warm_new_host: the cold run's pieceworks cache, an empty Inductor cache (the cache copied to a new host);
- warm_again (`--again`): a second warm start on the first host, for the spread.
A host is a temporary folder (`TMPDIR`, under which Inductor keeps its default cache) and `TORCHINDUCTOR_CACHE_DIR`
is unset, as on a machine nobody configured: pieceworks then keeps Inductor's cache inside its own, which is what a
new host inherits. Every folder is removed at exit. Exit status 1 when a warm start compiled anything, else 0.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable

from .provenance import code_commit
from .scenario import run_scenario

__all__ = ["STARTS", "measure", "main"]

STARTS = ("cold", "warm", "warm_new_host")
COUNTED = {"inductor_compiles": "inductor_compiles", "artifacts_loaded": "compiled_artifacts_loaded",
           "dynamo_traces": "dynamo_traces", "traces_reused": "traces_reused"}  # {field: counter without "num_"}


def measure(device: str, layers: int = 12, again: bool = False, capture: bool = False, profile: bool = False,
            progress: Callable[[str], None] = functools.partial(print, file=sys.stderr, flush=True)) -> dict:
    """`{start: {...}}` for each start, in order (see the module doc): seconds of the first call and of the whole
    process; the first call split into `trace_seconds` (outside the backend: Dynamo's trace or reading the serving
    record, and one run), `split_seconds`, `load_seconds` and `compile_seconds`; Inductor compiles, artifacts loaded,
    Dynamo traces and traces reused; the worst error against eager; with `capture` (CUDA), `capture_seconds` of
    every default capture size (PIECEWISE), their number, and the pool bytes estimated before and read after it; with
    `profile`, the warm start's `first_call_profile` (`profile.host_profile`) from one more warm start."""
    with tempfile.TemporaryDirectory(prefix="pieceworks-warm-start-", ignore_cleanup_errors=True) as work:
        args = ("--model", "toy_llama", "--layers", str(layers), "--cache-dir", os.path.join(work, "cache"),
                "--device", device, "--batches", "1,7,64,300")
        hosts = {"cold": "host", "warm": "host", "warm_new_host": "new-host", "warm_again": "host"}
        env, unset = lambda host: {"TMPDIR": os.path.join(work, host)}, ("TORCHINDUCTOR_CACHE_DIR",)
        results = {}
        for start in (*STARTS, "warm_again") if again else STARTS:
            os.makedirs(env(hosts[start])["TMPDIR"], exist_ok=True)
            progress(f"compile {start} on {device} (a fresh process)")
            began = time.perf_counter()
            report = run_scenario(*args, *(["--capture"] if capture else []), env=env(hosts[start]), unset=unset,
                                  timeout=500)
            counters, build, first = report["counters"], report["build_seconds"], report["first_call_s"]
            results[start] = {"first_call_seconds": first, "process_seconds": time.perf_counter() - began,
                              "trace_seconds": first - build["backend"], "max_rel_error": report["max_rel_error"],
                              **{f"{k}_seconds": build[k] for k in ("split", "load", "compile", "backend")},
                              **{k: counters[f"num_{c}"] for k, c in COUNTED.items()}, **report["capture"]}
            progress(f"compile {start}: {results[start]}")
        if profile:  # once more, under cProfile: where a warm first call goes (its times above stay unprofiled)
            results["warm"]["first_call_profile"] = run_scenario(*args, "--profile", env=env("host"), unset=unset,
                                                                 timeout=500)["first_call_profile"]
        return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cuda where torch sees one, else cpu")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--again", action="store_true", help="a second warm start on the first host")
    parser.add_argument("--capture", action="store_true", help="capture every default size after the first call")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    starts = measure(device, args.layers, args.again, args.capture)
    doc = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": code_commit(),
           "model": f"ToyLlama layers={args.layers}", "starts": starts}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    print(json.dumps(doc, indent=1))
    compiled = {s: r["inductor_compiles"] for s, r in starts.items() if s != "cold" and r["inductor_compiles"]}
    if compiled:
        print(f"FAIL: a warm start compiled pieces: {compiled}", file=sys.stderr)
    return 1 if compiled else 0


if __name__ == "__main__":
    sys.exit(main())
