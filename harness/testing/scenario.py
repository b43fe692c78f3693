"""Processes of their own: a compile-and-run scenario (the unit of cold/warm-start tests) and single test
cases.

`python -m pieceworks.harness.testing.scenario --model toy_llama --layers 12 --cache-dir D` compiles the model
with Inductor, runs a few batch sizes, checks each result against the eager model, and prints one JSON object
(`main` returns it). `run_scenario` runs it in a fresh interpreter: a warm start must be measured in a new
process, since a process remembers what it compiled. `run_case` calls one function in a fresh interpreter.
Every process this module starts first calls the start-up hook $PIECEWORKS_STARTUP_HOOK names
("package.module:function" or "path/file.py:function"), when set: a test session prepares its child processes
there as it prepared itself.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import json
import logging
import os
import pkgutil
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

__all__ = ["CaseError", "STARTUP_HOOK", "main", "run_case", "run_scenario"]

STARTUP_HOOK = "PIECEWORKS_STARTUP_HOOK"
_RESULT_MARK = "pieceworks-case-result: "


def _function(target: str) -> Any:
    """The function "path/to/file.py:function" or "package.module:function" names."""
    where, _, name = target.rpartition(":")
    if not where.endswith(".py"):
        return pkgutil.resolve_name(target)
    spec = importlib.util.spec_from_file_location(f"pieceworks_case_{os.path.basename(where)[:-3]}", where)
    assert spec is not None and spec.loader is not None  # a .py path always has a spec with a loader
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # as an import leaves it
    spec.loader.exec_module(module)
    return getattr(module, name)


def _run_startup_hook() -> None:
    if os.environ.get(STARTUP_HOOK):
        _function(os.environ[STARTUP_HOOK])()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model",
        choices=["silly", "toy_llama", "llama_1b", "llama_8b", "hf"],
        default="toy_llama",
        help="llama_1b, llama_8b: Llama-3.2-1B's and Llama-3.1-8B's shapes (all 32 layers) in bfloat16 "
        "with the unified attention; hf: the "
        "Hugging Face causal LM of --config, called with keywords (bfloat16 on CUDA); --layers: "
        "ToyLlama's",
    )
    parser.add_argument("--config", default=None, help="--model hf: the config.json (random weights)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--batches", default="1,7,64")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--capture", action="store_true", help="PIECEWISE: estimate, then capture every size")
    parser.add_argument("--profile", action="store_true", help="the first call under cProfile")
    args = parser.parse_args(argv)
    if args.model == "hf" and not args.config:
        parser.error(
            "--model hf needs --config PATH: the model's Hugging Face config.json "
            "(harness/models/configs/ has some)"
        )
    import torch

    import pieceworks
    from pieceworks.core import pool_bytes

    from ..measure.profile import host_profile
    from ..models import toy as models

    torch.manual_seed(0)
    model: Any  # a SillyModel, Llama, ToyLlama or transformers causal LM, each read as its branch knows it
    splitting_ops, call = models.SPLITTING_OPS, lambda fn, inputs: fn(*inputs)
    if args.model == "silly":
        model, make_inputs = models.SillyModel(), lambda b: (torch.randn(b, device=args.device),)
    elif args.model in ("llama_1b", "llama_8b"):  # a decode step of b sequences, attention metadata filled
        # here only: the other models' starts import no more than the floor's process
        from ..models import llama

        preset = llama.LLAMA_1B if args.model == "llama_1b" else llama.LLAMA_8B
        with torch.device(args.device):
            model = llama.Llama(preset).to(args.device, torch.bfloat16)

        def make_inputs(b: int) -> Any:
            return llama.decode_batch(model, b, device=args.device, seed=b)

        splitting_ops = model.config.splitting_ops
    elif args.model == "hf":  # b sequences of SEQ tokens, called as transformers models are: logits compared
        from ..models import hf_llama

        model = hf_llama.causal_lm(
            args.config, args.device, torch.float32 if args.device == "cpu" else torch.bfloat16
        )
        splitting_ops, call = hf_llama.SPLITTING_OPS, lambda fn, inputs: fn(**inputs, use_cache=False)

        def make_inputs(b: int) -> Any:
            ids = torch.randint(
                model.config.vocab_size, (b, hf_llama.SEQ), generator=torch.Generator().manual_seed(b)
            )
            return {"input_ids": ids.to(args.device)}
    else:
        config = models.ToyLlamaConfig(num_layers=args.layers)
        model = models.ToyLlama(config).to(args.device)

        def make_inputs(b: int) -> Any:
            return models.toy_llama_inputs(b, config, device=args.device, seed=b)

    mode = pieceworks.CUDAGraphMode.PIECEWISE if args.capture else pieceworks.CUDAGraphMode.NONE
    compiled = pieceworks.compile(
        model,
        pieceworks.CompilationConfig(
            splitting_ops=splitting_ops, cache_dir=args.cache_dir, cudagraph_mode=mode
        ),
    )
    before = pieceworks.counters.snapshot()
    worst, first_call_s, capture, first_call_profile = 0.0, None, {}, None
    first_call_log: list[str] = []  # why a warm start traced, compiled or rebuilt kernels
    with torch.no_grad():
        for batch in [int(b) for b in args.batches.split(",")]:
            inputs = make_inputs(batch)
            start, outs = time.perf_counter(), list[Any]()
            with logged(first_call_log) if first_call_s is None else contextlib.nullcontext():
                run = functools.partial(
                    lambda outs, inputs: outs.append(call(compiled, inputs)), outs, inputs
                )
                profile = host_profile(run, top=10) if args.profile and first_call_s is None else run()
            out = outs[0]
            if args.device != "cpu":
                torch.cuda.synchronize()
            if first_call_s is None:  # trace (or read the serving record) and compile (or load)
                first_call_s, first_call_profile = time.perf_counter() - start, profile
                if args.capture:
                    assert compiled.runtime is not None  # the first call made it
                    estimate, report = compiled.estimate_capture()["pool_bytes"], compiled.capture()
                    capture = {
                        "capture_seconds": report["seconds"],
                        "capture_sizes": report["sizes"],
                        "estimate_bytes": estimate,
                        "pool_bytes": pool_bytes(compiled.runtime.pool.handle),
                    }
                    out = call(compiled, inputs)  # replayed
            out, ref = (getattr(o, "logits", o) for o in (out, call(model, inputs)))  # a ModelOutput's logits
            if not bool(torch.isfinite(ref).all()):
                raise RuntimeError(
                    f"the eager model gave non-finite values at batch {batch}: nothing to compare"
                )
            error = float((out - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
            worst = max(worst, error if error == error else float("inf"))  # NaN counts as the worst
    after = pieceworks.counters.snapshot()
    graph = compiled.runtime.compiled if compiled.runtime is not None else None
    # build_seconds: where the first call's backend time went (split, load, compile); the rest is Dynamo's
    # trace (or reading the serving record) and one run of the model. capture (--capture): its seconds and
    # sizes, and the pool bytes estimated before it and read after it. first_call_profile (--profile):
    # `profile.host_profile`'s. first_call_log: what pieceworks logged during the first call (INFO and up)
    report = {
        "counters": {k: after[k] - before[k] for k in after},
        "first_call_s": first_call_s,
        "max_rel_error": worst,
        "torch": torch.__version__,
        "cache_dir": graph.cache_dir if graph else None,
        "build_seconds": dict(graph.build_seconds) if graph else {},
        "capture": capture,
        "first_call_profile": first_call_profile,
        "first_call_log": first_call_log,
    }
    print(json.dumps(report))
    return report


class _Lines(logging.Handler):
    """Keeps the message of each record it is given (INFO and up) in `lines`."""

    def __init__(self, lines: list[str]) -> None:
        super().__init__(logging.INFO)
        self.lines = lines

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(record.getMessage())
        except Exception:  # noqa: BLE001 - logging's own rule: a record that cannot be formatted is reported
            self.handleError(record)


@contextlib.contextmanager
def logged(lines: list[str]) -> Iterator[None]:
    """What the "pieceworks" logger emits in the block (INFO and up), appended to `lines`; its level is raised
    to INFO for the block where it was higher, and put back."""
    logger, handler = logging.getLogger("pieceworks"), _Lines(lines)
    level = logger.level
    if not logger.isEnabledFor(logging.INFO):
        logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


class CaseError(AssertionError):
    """A case run by `run_case` failed, crashed or timed out in its child process; the message has its
    output."""


def run_case(
    target: str,
    kwargs: dict[str, Any] | None = None,
    timeout: float = 120,
    env: dict[str, str] | None = None,
    unset: tuple[str, ...] = (),
    cwd: str | os.PathLike | None = None,
) -> Any:
    """Call `target(**kwargs)` ("path/to/file.py:function" or "package.module:function") in a fresh
    interpreter, in folder `cwd` (default this process's); return what it returned (JSON in, JSON out). `env`
    adds to this process's environment for the child; `unset` names variables the child must not inherit.

    For cases whose failure can be a sticky CUDA error (a device-side assert, an illegal address), which
    poisons the CUDA context for the rest of its process: in a child only the child dies, and the calling test
    fails with `CaseError` carrying the child's exit status and the end of its output. A case that outlives
    `timeout` is killed and fails the same way.
    """
    cmd = [
        sys.executable,
        "-c",
        "from pieceworks.harness.testing.scenario import _case_child; _case_child()",
        target,
    ]
    child_env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset}
    try:
        proc = subprocess.run(
            cmd,
            input=json.dumps(kwargs or {}),
            capture_output=True,
            text=True,
            timeout=timeout,
            env=child_env,
            cwd=cwd,
        )
    except subprocess.TimeoutExpired as exc:
        out = [
            x.decode(errors="replace") if isinstance(x, bytes) else (x or "")
            for x in (exc.stderr, exc.stdout)
        ]
        raise CaseError(
            f"case {target} did not finish in {timeout:g} s (killed); output:\n{out[0][-4000:]}"
            f"{out[1][-1000:]}"
        ) from None
    results = [line for line in proc.stdout.splitlines() if line.startswith(_RESULT_MARK)]
    if proc.returncode != 0 or not results:
        raise CaseError(
            f"case {target}({kwargs}) failed in its own process (exit status {proc.returncode}):\n"
            f"{proc.stderr[-6000:]}{proc.stdout[-1000:]}"
        )
    return json.loads(results[-1][len(_RESULT_MARK) :])


def _case_child() -> None:
    """The child side of `run_case`: the start-up hook, then the case; its result printed after a mark."""
    kwargs = json.loads(sys.stdin.read() or "{}")
    _run_startup_hook()
    print(_RESULT_MARK + json.dumps(_function(sys.argv[1])(**kwargs)), flush=True)


def run_scenario(
    *args: str, env: dict[str, str] | None = None, timeout: float = 600, unset: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The report of `main(args)` run in a fresh interpreter by `run_case` (which says what it raises)."""
    return run_case(
        "pieceworks.harness.testing.scenario:main", {"argv": list(args)}, timeout, env=env, unset=unset
    )


if __name__ == "__main__":
    _run_startup_hook()
    main()
