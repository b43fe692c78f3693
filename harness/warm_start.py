"""Cold, warm, and warm on a new host: ToyLlama compiled in fresh processes, where each first call's time goes.

`python -m pieceworks.harness.warm_start [--device cuda] [--layers 12] [--again] --out F.json` (the compile benchmark,
`suites/benchmarks/compile.py`, runs the same `measure`). Each start is `pieceworks.harness.scenario` in a process
of its own (Inductor, mode NONE, batches 1, 7, 64, 300), with one pieceworks cache for all of them:
- cold: empty pieceworks cache, empty Inductor cache;
- warm: the cold run's pieceworks cache and Inductor cache (a restart on the same host);
- warm_new_host: the cold run's pieceworks cache, an empty Inductor cache (the cache copied to a new host);
- warm_again (`--again`): a second warm start on the first host, for the spread.
A host is a temporary folder (`TMPDIR`, under which Inductor keeps its default cache) and `TORCHINDUCTOR_CACHE_DIR`
is unset, as on a machine nobody configured: pieceworks then keeps Inductor's cache inside its own, which is what a
new host inherits. Per start: seconds of the first call (trace + compile or load + one run), of the whole process,
Inductor compiles, artifacts loaded, the error against eager, and of the first call the seconds inside the
pieceworks backend and, of those, compiling or loading the pieces (`CompiledGraph.build_seconds`). `--out` also records
the device, torch and the commit (the report reads `results/bench/<machine>/warm_start_<commit>.json`).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

from .provenance import code_commit
from .scenario import run_scenario

__all__ = ["STARTS", "measure", "main"]

STARTS = ("cold", "warm", "warm_new_host")


def measure(device: str, layers: int = 12, again: bool = False,
            progress: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> dict:
    """`{start: {first_call_seconds, process_seconds, inductor_compiles, artifacts_loaded, max_rel_error,
    backend_seconds, compile_or_load_seconds}}` for each start, in order (see the module doc)."""
    with tempfile.TemporaryDirectory(prefix="pieceworks-warm-start-", ignore_cleanup_errors=True) as work:
        return _starts(device, layers, again, progress, work)


def _starts(device: str, layers: int, again: bool, progress: Callable[[str], None], work: str) -> dict:
    """`measure`'s starts, with the pieceworks cache and both hosts under `work`."""
    pieceworks_cache, first_host, new_host = (os.path.join(work, name) for name in ("cache", "host", "new-host"))
    os.makedirs(first_host)
    os.makedirs(new_host)
    hosts = {"cold": first_host, "warm": first_host, "warm_new_host": new_host, "warm_again": first_host}
    results: dict[str, dict[str, Any]] = {}
    for start in (*STARTS, "warm_again") if again else STARTS:
        progress(f"compile {start} on {device} (a fresh process)")
        began = time.perf_counter()
        report = run_scenario(
            "--model", "toy_llama", "--layers", str(layers), "--cache-dir", pieceworks_cache, "--device", device,
            "--batches", "1,7,64,300", env={"TMPDIR": hosts[start]}, unset=("TORCHINDUCTOR_CACHE_DIR",),
            timeout=500,
        )
        counters = report["counters"]
        results[start] = {
            "first_call_seconds": report["first_call_s"],
            "process_seconds": time.perf_counter() - began,
            "inductor_compiles": counters["num_inductor_compiles"],
            "artifacts_loaded": counters["num_compiled_artifacts_loaded"],
            "max_rel_error": report["max_rel_error"],
            "backend_seconds": report["build_seconds"].get("backend"),
            "compile_or_load_seconds": report["build_seconds"].get("compile"),
        }
        progress(f"compile {start}: {results[start]}")
    return results


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=None, help="cuda where torch sees one, else cpu")
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--again", action="store_true", help="a second warm start on the first host")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    doc = {"device": torch.cuda.get_device_name() if device == "cuda" else "cpu", "torch": torch.__version__,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"), "commit": code_commit(),
           "model": f"ToyLlama layers={args.layers}", "starts": measure(device, args.layers, args.again)}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)
    print(json.dumps(doc, indent=1))
    return doc


if __name__ == "__main__":
    main()
