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
    parser.add_argument("--profile", default=None, help="write a cProfile of the first call (trace + compile) here")
    args = parser.parse_args(argv)
    if os.environ.get("PIECEWORKS_MUTANT"):  # `pytest --pieceworks-mutant`: the child runs the mutant too
        import pytest

        from .mutants import apply

        apply(os.environ["PIECEWORKS_MUTANT"], pytest.MonkeyPatch())

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
            profiler = None
            if first_call_s is None and args.profile:
                import cProfile

                profiler = cProfile.Profile()
                profiler.enable()
            start = time.perf_counter()
            out = compiled(*inputs)
            if args.device != "cpu":
                torch.cuda.synchronize()
            if first_call_s is None:
                first_call_s = time.perf_counter() - start
            if profiler is not None:
                profiler.disable()
                profiler.dump_stats(args.profile)
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
        "cache_dir": runtime.graph.cache_dir if runtime is not None else None,
        # where the first call's backend time went (split, compile or load); the rest of the first call is Dynamo's
        # trace, its guards and one run of the model
        "build_seconds": dict(runtime.graph.build_seconds) if runtime is not None else {},
    }
    print(json.dumps(report))
    return report


def run_scenario(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600, unset: tuple[str, ...] = ()
) -> dict[str, Any]:
    """Run `main(args)` in a fresh Python process; return its report. Raises with its stderr if it fails.

    `env` adds to this process's environment; `unset` names variables the child must not inherit.
    """
    child_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset}
    proc = subprocess.run(
        [sys.executable, "-m", "pieceworks.harness.scenario", *args],
        capture_output=True, text=True, timeout=timeout, env=child_env,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"scenario {args} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    report["stderr"] = proc.stderr
    return report


# ---- one test case in a process of its own: for GPU cases whose failure can poison the process ---------------
class CaseError(AssertionError):
    """A case run by `run_case` failed, crashed or timed out in its child process; the message has its output."""


_RESULT_MARK = "pieceworks-case-result: "


def run_case(target: str, kwargs: dict[str, Any] | None = None, timeout: float = 120) -> Any:
    """Call `target(**kwargs)` in a fresh interpreter; return what it returned (JSON in, JSON out).

    `target` is "path/to/file.py:function" or "package.module:function". For cases whose failure can be a sticky
    CUDA error (a device-side assert from an out-of-bounds gather, an illegal address): it poisons the CUDA context
    for the rest of its process, so run in this process it would fail every later test too, or crash pytest. In a
    child, only the child dies, and the calling test fails with `CaseError` (an AssertionError) carrying the child's
    exit status and the end of its output, the CUDA error included. A case that outlives `timeout` is killed and
    fails the same way. The mutant named by $PIECEWORKS_MUTANT (`pytest --pieceworks-mutant` sets it) is applied in
    the child before the case is imported.
    """
    cmd = [sys.executable, "-c", "from pieceworks.harness.scenario import _case_child; _case_child()", target]
    try:
        proc = subprocess.run(cmd, input=json.dumps(kwargs or {}), capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        out = [x.decode(errors="replace") if isinstance(x, bytes) else (x or "") for x in (exc.stderr, exc.stdout)]
        raise CaseError(f"case {target} did not finish in {timeout:g} s (killed); output:\n{out[0][-4000:]}"
                        f"{out[1][-1000:]}") from None
    results = [line for line in proc.stdout.splitlines() if line.startswith(_RESULT_MARK)]
    if proc.returncode != 0 or not results:
        raise CaseError(f"case {target}({kwargs}) failed in its own process (exit status {proc.returncode}):\n"
                        f"{proc.stderr[-6000:]}{proc.stdout[-1000:]}")
    return json.loads(results[-1][len(_RESULT_MARK):])


def _case_child() -> None:
    """The child side of `run_case`: apply the mutant, import the target, call it, print its result."""
    import importlib
    import importlib.util

    target = sys.argv[1]
    kwargs = json.loads(sys.stdin.read() or "{}")
    mutant = os.environ.get("PIECEWORKS_MUTANT")
    if mutant:
        import pytest

        from .mutants import apply

        apply(mutant, pytest.MonkeyPatch())
    where, _, name = target.rpartition(":")
    if where.endswith(".py"):
        spec = importlib.util.spec_from_file_location(f"pieceworks_case_{os.path.basename(where)[:-3]}", where)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    else:
        module = importlib.import_module(where)
    result = getattr(module, name)(**kwargs)
    print(_RESULT_MARK + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
