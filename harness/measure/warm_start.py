"""Cold, warm, and warm on a new host: a model compiled in fresh processes, where each first call's time goes.

`measure` is the compile benchmark's measurement (`bash ci/main.sh --bench '^compile'` runs it alone). Each
start is one `pieceworks.harness.testing.scenario` process of one `model` (ToyLlama of `layers`; "llama_1b",
"llama_8b": the 1B's and the whole 8B's shapes in bfloat16; "hf": the Hugging Face causal LM of the
config.json `config`, called with keywords) compiled with Inductor, mode NONE, or PIECEWISE with every default
size captured after the first call (`capture`); batches 1, 7, 64, 300; all starts with one pieceworks cache:
- cold: empty pieceworks cache, empty Inductor cache;
- warm: the cold run's pieceworks cache and Inductor cache (a restart on the same host);
- warm_new_host: the cold run's pieceworks cache, an empty Inductor cache (the cache copied to a new host).
The floor: a fresh process that imports torch and pieceworks and exits (the fastest of three), what every
start pays before its first call; the report gives each start's process seconds less it, and what importing
pieceworks adds to importing torch (a fresh process importing torch alone, the fastest of three). Python
bytecode is cached, as a pip install leaves it: where torch's is not (an image whose packages ship without
`.pyc` files, often with `PYTHONDONTWRITEBYTECODE` set), the starts get a bytecode cache of their own
(`PYTHONPYCACHEPREFIX`, the caller's where set), filled first by a priming start of the same model (its own
caches, batch 1, not reported). Without it every process would compile torch's sources again (seconds before
its first call), and the cold start also those of the modules its first call imports, which the warm starts
then read. A host is a temporary folder (`TMPDIR`, under which Inductor keeps its default cache) and
`TORCHINDUCTOR_CACHE_DIR` is unset, as on a machine nobody configured: pieceworks then keeps Inductor's cache
inside its own, which is what a new host inherits. Every folder is removed at exit.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

from ..testing.scenario import run_scenario

__all__ = ["STARTS", "floor_seconds", "measure"]

STARTS = ("cold", "warm", "warm_new_host")
STDERR = functools.partial(print, file=sys.stderr, flush=True)  # where `measure` reports its progress
HOSTS = {"cold": "host", "warm": "host", "warm_new_host": "new-host"}  # a host: a TMPDIR of its own
PROFILED = {"warm": "host", "warm_new_host": "profiled-new-host"}  # the host of each start profiled once more
COUNTED = {
    "inductor_compiles": "inductor_compiles",
    "artifacts_loaded": "compiled_artifacts_loaded",
    "dynamo_traces": "dynamo_traces",
    "traces_reused": "traces_reused",
    "kernel_rebuilds": "kernel_rebuilds",
}  # {field: counter without "num_"}


def measure(
    device: str,
    layers: int = 12,
    capture: bool = False,
    profile: bool = False,
    model: str = "toy_llama",
    config: str | None = None,
    progress: Callable[[str], None] = STDERR,
) -> dict:
    """`{start: {...}}` for each start, in order (see the module doc): seconds of the first call and of the
    whole process; the first call split into `trace_seconds` (outside the backend: Dynamo's trace or reading
    the serving record, and one run), `split_seconds`, `load_seconds` and `compile_seconds`; Inductor
    compiles, artifacts loaded, Dynamo traces and traces reused; the worst error against eager; the first
    call's `log` (what pieceworks logged: why it traced, compiled or rebuilt kernels); with `capture` (CUDA),
    `capture_seconds` of every default capture size (PIECEWISE), their number, and the pool bytes estimated
    before and read after it; with `profile`, each warm start's `first_call_profile` (`profile.host_profile`)
    from one more start of its kind."""
    with tempfile.TemporaryDirectory(prefix="pieceworks-warm-start-", ignore_cleanup_errors=True) as work:
        model_args = (
            "--model",
            model,
            "--layers",
            str(layers),
            "--device",
            device,
            *(("--config", config) if config else ()),
        )
        args = (*model_args, "--cache-dir", os.path.join(work, "cache"), "--batches", "1,7,64,300")
        bytecode = bytecode_cache(work)
        prime = bytecode is not None

        def env(host: str) -> dict[str, str]:
            return {"TMPDIR": os.path.join(work, host), **(bytecode or {})}

        unset = ("TORCHINDUCTOR_CACHE_DIR", *(("PYTHONDONTWRITEBYTECODE",) if prime else ()))
        if bytecode is not None:  # prime it
            progress(f"priming the bytecode cache {bytecode['PYTHONPYCACHEPREFIX']}: torch's is not cached")
            os.makedirs(env("prime")["TMPDIR"])
            run_scenario(
                *model_args,
                "--cache-dir",
                os.path.join(work, "prime-cache"),
                "--batches",
                "1",
                env=env("prime"),
                unset=unset,
                timeout=500,
            )
        results = {}
        for start in STARTS:
            os.makedirs(env(HOSTS[start])["TMPDIR"], exist_ok=True)
            progress(f"compile {start} on {device} (a fresh process)")
            began = time.perf_counter()
            report = run_scenario(
                *args, *(["--capture"] if capture else []), env=env(HOSTS[start]), unset=unset, timeout=500
            )
            counters, build, first = report["counters"], report["build_seconds"], report["first_call_s"]
            results[start] = {
                "first_call_seconds": first,
                "process_seconds": time.perf_counter() - began,
                "trace_seconds": first - build["backend"],
                "max_rel_error": report["max_rel_error"],
                **{f"{k}_seconds": build[k] for k in ("split", "load", "compile", "backend")},
                **{k: counters[f"num_{c}"] for k, c in COUNTED.items()},
                **report["capture"],
                "log": report["first_call_log"],
            }
            progress(f"compile {start}: {results[start]}")
        progress("floor: a fresh process importing torch and pieceworks, and one importing torch alone")
        results["floor"] = {
            "process_seconds": min(floor_seconds(env("host"), unset) for _ in range(3)),
            "torch_seconds": min(floor_seconds(env("host"), unset, "torch") for _ in range(3)),
            "bytecode_primed": prime,
        }
        for start, host in PROFILED.items() if profile else ():
            # once more, under cProfile: where each warm first call goes (its times above stay unprofiled); a
            # new host is a host folder of its own again
            os.makedirs(env(host)["TMPDIR"], exist_ok=True)
            results[start]["first_call_profile"] = run_scenario(
                *args, "--profile", env=env(host), unset=unset, timeout=500
            )["first_call_profile"]
        return results


def bytecode_cached() -> bool:
    """Whether a fresh process finds torch's bytecode cached (its `__init__`'s, where `PYTHONPYCACHEPREFIX`
    puts it)."""
    spec = importlib.util.find_spec("torch")
    assert spec is not None and spec.origin is not None  # torch is installed: the harness needs it
    return os.path.exists(importlib.util.cache_from_source(spec.origin))


def bytecode_cache(work: str) -> dict[str, str] | None:
    """The environment giving every start one bytecode cache (the caller's `PYTHONPYCACHEPREFIX`, else one in
    `work`), or None where torch's bytecode is cached (see the module doc)."""
    return (
        None
        if bytecode_cached()
        else {"PYTHONPYCACHEPREFIX": os.environ.get("PYTHONPYCACHEPREFIX") or os.path.join(work, "bytecode")}
    )


def floor_seconds(
    env: dict[str, str] | None = None, unset: tuple[str, ...] = (), imports: str = "torch, pieceworks"
) -> float:
    """Seconds of a fresh interpreter that imports `imports` (torch and pieceworks) and exits (`env` added to
    its environment, `unset` taken out)."""
    began = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", f"import {imports}"],
        check=True,
        timeout=300,
        capture_output=True,
        env={k: v for k, v in {**os.environ, **(env or {})}.items() if k not in unset},
    )
    return time.perf_counter() - began
