"""What the asv suites share: run folders, the skip rule, the models, clean-up between builds, details files.

Conventions of the suites:
- `setup_cache` does the expensive work once per class and returns a dict of plain numbers (asv pickles it). A
  class that cannot run here returns `{"skip": reason}`; an entry that does not apply is `{"skip": reason}`,
  one that broke is `{"error": message}`. `setup()` turns those into asv's skip (NotImplementedError with the
  reason as its message: asv shows only n/a, so the reason also goes to the details file, and the report shows
  it) or failure (RuntimeError); `track_` methods return the number.
- One pieceworks cache and one Inductor cache per run (under $PIECEWORKS_BENCH_DIR, which the caller removes;
  without it, a temporary folder per process, removed when the process exits), shared by every class except
  the compile benchmarks, which make their own cold ones.
- `spawn_ranks` runs a function on every rank of a process group of fresh processes (tensor parallel).
- Where $PIECEWORKS_BENCH_DETAILS is set, each class writes what asv cannot hold (skip reasons, errors against
  eager, kernel profiles, build seconds) to `<that folder>/<class>.json`; the report reads them.
Nothing here imports torch at import time.
"""

from __future__ import annotations

import datetime
import json
import os
import pkgutil
import socket
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

BATCHES = [1, 2, 8, 64, 256, 512]
MAX_CAPTURE = 512  # vLLM's default capture sizes up to 512: 51 sizes
GPU_TIMEOUT = 560  # seconds for one class's setup_cache (asv's default is 60)
try:  # asv's skip from inside a benchmark (setup raises plain NotImplementedError)
    from asv_runner.benchmarks.mark import SkipNotImplemented as Skip
except ImportError:  # asv not installed: the suites are imported by tools only
    Skip = NotImplementedError

USER_IMPLEMENTATIONS = [
    s.strip() for s in os.environ.get("PIECEWORKS_IMPLEMENTATIONS", "").split(",") if s.strip()
]
IMPLEMENTATIONS = [
    "eager",
    "inductor",
    "reduce-overhead",
    "pieceworks-none",
    "pieceworks-piecewise",
    "pieceworks-full",
    "pieceworks-full_and_piecewise",
    "meta-pcg",
    *USER_IMPLEMENTATIONS,
]


_OWN_RUN_DIR: list[
    tempfile.TemporaryDirectory
] = []  # without $PIECEWORKS_BENCH_DIR: removed at the process's exit


def run_dir() -> str:
    """This run's folder for shared caches; sets PIECEWORKS_CACHE_DIR and TORCHINDUCTOR_CACHE_DIR under it."""
    if not os.environ.get("PIECEWORKS_BENCH_DIR"):
        _OWN_RUN_DIR.append(tempfile.TemporaryDirectory(prefix="pieceworks-asv-", ignore_cleanup_errors=True))
        os.environ["PIECEWORKS_BENCH_DIR"] = _OWN_RUN_DIR[-1].name
    base = os.environ["PIECEWORKS_BENCH_DIR"]
    os.makedirs(base, exist_ok=True)
    os.environ.setdefault("PIECEWORKS_CACHE_DIR", os.path.join(base, "pieceworks-cache"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(base, "inductor-cache"))
    return base


def progress(message: str) -> None:
    """One line on stderr (asv shows it with --show-stderr, and in its log when a setup fails)."""
    print(f"[pieceworks bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def cuda_skip_reason() -> str | None:
    import torch

    if not torch.cuda.is_available():
        return f"needs CUDA: torch {torch.__version__} sees no CUDA device here (run asv on a GPU runner)"
    return None


def check(entry: Any) -> None:
    """asv's skip for a `{"skip": reason}` entry, a failure for an `{"error": message}` one."""
    if isinstance(entry, dict):
        if "skip" in entry:
            raise NotImplementedError(entry["skip"])
        if "error" in entry:
            raise RuntimeError(entry["error"])


LLAMA_MODELS = {
    "llama_1b": ("LLAMA_1B", None),
    "llama_8b": ("LLAMA_8B", None),
    "llama_8b_4l": ("LLAMA_8B", 4),
}  # preset, layers (None: all)


def model_and_inputs(model: str, dtype: str, device: str = "cuda") -> tuple[Any, Any, list[str]]:
    """(model, make_inputs(batch), splitting ops), weights/inputs in `dtype`: ToyLlama (12 layers),
    SillyModel, or a `LLAMA_MODELS` preset (random weights, paged-KV attention; `make_inputs(b)`: b decode
    tokens, one per sequence, the model's attention metadata filled for them and current)."""
    import dataclasses

    import torch

    from pieceworks.harness.models import llama
    from pieceworks.harness.models import toy as models

    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    if model in LLAMA_MODELS:
        preset, layers = LLAMA_MODELS[model]
        config = getattr(llama, preset)
        config = dataclasses.replace(config, num_layers=layers or config.num_layers)
        net = llama.Llama(config).to(device, dt)
        return net, lambda b: llama.decode_batch(net, b, device=device, seed=b), llama.SPLITTING_OPS
    if model == "silly":
        return (
            models.SillyModel(),
            lambda b: (torch.randn(b, generator=torch.Generator().manual_seed(b)).to(device, dt),),
            models.SPLITTING_OPS,
        )
    config = models.ToyLlamaConfig(num_layers=12)
    net = models.ToyLlama(config).to(device, dt)
    return net, lambda b: models.toy_llama_inputs(b, config, device=device, seed=b), models.SPLITTING_OPS


def release() -> None:
    """Drop what the last build left behind: Dynamo's caches, garbage, the allocator's free blocks."""
    import gc

    import torch

    torch._dynamo.reset()
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def host() -> dict[str, Any]:
    """What host-side times depend on: the CPU model, the logical CPUs this process may run on of those the
    host has, the load average when the run began (other work on the host), and the GPUs this process sees."""
    import torch

    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in _read("/proc/cpuinfo").splitlines()
            if line.startswith("model name")
        ),
        None,
    )
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "cpu_model": model,
        "cpus_usable": usable,
        "cpus": os.cpu_count(),
        "load_average": round(os.getloadavg()[0], 2) if hasattr(os, "getloadavg") else None,
        "gpus_visible": torch.cuda.device_count() if torch.cuda.is_available() else 0,
    }


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def environment() -> dict[str, Any]:
    """Device, driver, CUDA, torch, Triton, Python, the host (`host`), the date and the commit measured
    ($PIECEWORKS_COMMIT, which ci/main.sh sets, else this checkout's HEAD: `provenance.code_commit`): what a
    number needs next to it."""
    import platform

    import torch

    from pieceworks.harness.measure.provenance import code_commit

    info: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "commit": os.environ.get("PIECEWORKS_COMMIT") or code_commit(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "machine": platform.node(),
        "cpu": platform.processor() or platform.machine(),
        "host": host(),
    }
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError:
        info["triton"] = None
    if torch.cuda.is_available():
        from pieceworks.harness.measure.memory import nvml_status

        info["device"] = torch.cuda.get_device_name()
        info["nvml"] = nvml_status()
        try:
            import pynvml

            info["driver"] = pynvml.nvmlSystemGetDriverVersion()
        except Exception:  # noqa: BLE001 - the NVML status line says why
            info["driver"] = None
    else:
        info["device"] = "cpu"
    return info


def write_details(name: str, data: dict[str, Any]) -> None:
    """Write `data` (plus the environment) to $PIECEWORKS_BENCH_DETAILS/<name>.json, if that variable is
    set."""
    folder = os.environ.get("PIECEWORKS_BENCH_DETAILS")
    if not folder:
        return
    os.makedirs(folder, exist_ok=True)
    doc = {"environment": environment(), **data}
    path = os.path.join(folder, f"{name}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True, default=str)
    os.replace(path + ".tmp", path)


def spawn_ranks(
    worker: Callable[..., dict],
    folder: Path,
    *args: Any,
    world: int = 2,
    backend: str = "gloo",
    timeout: float = 240,
) -> list:
    """`worker(rank, folder, *args)` (a module-level function) in `world` fresh processes forming one process
    group (`backend`; on NCCL, rank r uses GPU r); each rank's returned dict (JSON) with
    `process_group_closed` added (whether its group closed within 30 s: a communicator whose collectives live
    in CUDA graphs that are still alive does not close, pytorch#115388; the rank then leaves without closing
    it), in rank order. A rank that raises prints its traceback and makes this raise; ranks still running
    after `timeout` seconds (a collective replayed from a CUDA graph escapes the group's own 60 s timeout) are
    terminated, printing the Python stacks of their threads to stderr, and this raises TimeoutError.
    Importable in the ranks: what `sys.path` reaches here, and this package (asv imports the suites through an
    import hook of its own, which spawned processes lack)."""
    import torch.multiprocessing

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    root = str(Path(__file__).parents[__name__.count(".")])  # the folder this package is imported from
    added = root not in sys.path
    if added:
        sys.path.append(
            root
        )  # copied into each rank as it starts (multiprocessing's spawn), removed here after
    try:
        ranks = torch.multiprocessing.start_processes(
            _rank_main,
            args=(worker, str(folder), port, world, backend, args),
            nprocs=world,
            join=False,
            start_method="spawn",
        )
    finally:
        if added:
            sys.path.remove(root)
    deadline = time.monotonic() + timeout
    try:
        while not ranks.join(timeout=1):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"ranks still running after {timeout:g} s: a collective waits for a rank that "
                    "never joins it (each rank's stacks are in its stderr)"
                )
    finally:
        for process in ranks.processes:
            if process.is_alive():
                process.terminate()
    return [json.loads((Path(folder) / f"rank{rank}.json").read_text()) for rank in range(world)]


def _rank_main(
    rank: int, worker: Callable[..., dict], folder: str, port: int, world: int, backend: str, args: tuple
) -> None:
    import faulthandler
    import gc
    import signal
    import threading
    import traceback

    import torch

    from pieceworks.harness.testing.scenario import STARTUP_HOOK

    faulthandler.register(
        signal.SIGTERM, chain=True
    )  # a rank terminated past the deadline says where it waited
    if hook := os.environ.get(STARTUP_HOOK):  # a mutant run's children apply its mutant too
        pkgutil.resolve_name(hook)()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    if backend == "nccl":
        torch.cuda.set_device(rank)
    torch.distributed.init_process_group(
        backend, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60)
    )
    out = Path(folder) / f"rank{rank}.json"
    try:
        result = worker(rank, Path(folder), *args)
        out.write_text(json.dumps({**result, "process_group_closed": False}))
    except BaseException:
        # now: closing the group below may end this process before the exception is shown
        traceback.print_exc()
        sys.stderr.flush()
        traceback.clear_frames(sys.exc_info()[2])  # the worker's frames hold its models and their CUDA graphs
        raise
    finally:
        gc.collect()  # what the worker dropped: compiled models and their CUDA graphs
        closing = threading.Thread(target=_close_group, args=(backend,), daemon=True)
        closing.start()
        closing.join(30)
        if closing.is_alive():
            print(
                f"rank {rank}: the process group did not close in 30 s; leaving without closing it",
                file=sys.stderr,
                flush=True,
            )
            sys.stdout.flush()
            os._exit(0 if out.exists() else 1)
    out.write_text(json.dumps({**result, "process_group_closed": True}))


def _close_group(backend: str) -> None:
    import torch

    if backend == "nccl":
        # a replayed collective whose peer is gone waits here: under the caller's limit
        torch.cuda.synchronize()
    torch.distributed.destroy_process_group()
