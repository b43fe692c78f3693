"""One compile-and-run in a process of its own, reported as a JSON line: the unit of cold/warm-start tests.

`python -m pieceworks.harness.scenario --model toy_llama --layers 12 --cache-dir D` compiles the model, runs a few
batch sizes, checks each result against the model run eagerly, and prints one JSON object: counter deltas,
seconds for the first call, the largest error, and the torch version. `run_scenario(...)` runs it in a fresh
interpreter and returns that object (warm starts must be measured in a new process: a process remembers what it
compiled).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Any

__all__ = ["run_scenario", "main"]


def _build(model_name: str, layers: int, device: str) -> tuple[Any, Any]:
    import torch

    from . import models

    torch.manual_seed(0)
    if model_name == "silly":
        return models.SillyModel(), lambda b: (torch.randn(b, device=device),)
    config = models.ToyLlamaConfig(num_layers=layers)
    model = models.ToyLlama(config).to(device)
    return model, lambda b: models.toy_llama_inputs(b, config, device=device, seed=b)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["silly", "toy_llama"], default="toy_llama")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--compiler", choices=["inductor", "eager"], default="inductor")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--compile-sizes", default="", help="comma-separated static sizes")
    parser.add_argument("--batches", default="1,7,64")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)

    import torch

    import pieceworks
    from pieceworks import counters

    from . import models

    model, make_inputs = _build(args.model, args.layers, args.device)
    config = pieceworks.CompilationConfig(
        splitting_ops=models.SPLITTING_OPS,
        compiler=args.compiler,
        cache_dir=args.cache_dir,
        compile_sizes=[int(s) for s in args.compile_sizes.split(",") if s],
        cudagraph_mode=pieceworks.CUDAGraphMode.NONE,
    )
    compiled = pieceworks.compile(model, config)
    before = counters.snapshot()
    batches = [int(b) for b in args.batches.split(",")]
    worst = 0.0
    first_call_s = None
    with torch.no_grad():
        for batch in batches:
            inputs = make_inputs(batch)
            start = time.perf_counter()
            out = compiled(*inputs)
            if first_call_s is None:
                first_call_s = time.perf_counter() - start
            ref = model(*inputs)
            if not bool(torch.isfinite(ref).all()):
                raise RuntimeError(f"the eager model gave non-finite values at batch {batch}: nothing to compare")
            error = float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
            worst = max(worst, error if error == error else float("inf"))  # NaN counts as the worst
    after = counters.snapshot()
    runtime = compiled.runtime
    report = {
        "counters": {k: after[k] - before[k] for k in after},
        "first_call_s": first_call_s,
        "max_rel_error": worst,
        "torch": torch.__version__,
        "cache_dir": runtime.cache_dir if runtime is not None else None,
    }
    print(json.dumps(report))
    return report


def run_scenario(*args: str, env: dict[str, str] | None = None, timeout: float = 600) -> dict[str, Any]:
    """Run `main(args)` in a fresh Python process; return its report. Raises with its stderr if it fails."""
    proc = subprocess.run(
        [sys.executable, "-m", "pieceworks.harness.scenario", *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})},
    )
    if proc.returncode != 0:
        raise RuntimeError(f"scenario {args} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    report["stderr"] = proc.stderr
    return report


if __name__ == "__main__":
    main()
