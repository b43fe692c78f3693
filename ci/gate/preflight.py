"""Preflight of a GPU benchmark run: record what the numbers depend on, refuse a GPU that would skew them.

`python -m pieceworks.gate.preflight [--out FILE] [--allow-busy] [--expect-sm-mhz MHZ]` records the GPU,
driver, versions, compile-cache key factors and the environment variables that change compiled code, and
checks the GPU through NVML, idle and under a short load of its own, against the policy of docs/ci.md.

Exit status: 0 ready; 1 no usable GPU (no CUDA device, NVML missing); 75 (EX_TEMPFAIL, try later) busy or
throttled, with one line per finding. --allow-busy records the findings, warns and exits 0 (humans only; CI
never passes it).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

__all__ = ["Limits", "Finding", "assess", "main", "READY", "NO_GPU", "BUSY"]

READY, NO_GPU, BUSY = 0, 1, 75

# NVML clock-event ("throttle") reasons, by bit from 0x1 up (nvml.h, stable since r4xx).
_REASONS = (
    "gpu_idle",
    "applications_clocks_setting",
    "sw_power_cap",
    "hw_slowdown",
    "sync_boost",
    "sw_thermal_slowdown",
    "hw_thermal_slowdown",
    "hw_power_brake_slowdown",
    "display_clock_setting",
)
# Reasons that mean the hardware is protecting itself: numbers taken now are not this GPU's numbers.
_BAD_REASONS = {"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
_ENV_PREFIXES = (
    "PIECEWORKS_",
    "TORCHINDUCTOR_",
    "TORCH_",
    "TRITON_",
    "CUDA_",
    "NVIDIA_",
    "PYTORCH_",
    "CUBLAS",
)


@dataclasses.dataclass(frozen=True)
class Limits:
    max_used_mib: float = (
        1024.0  # device memory in use before we start (driver reserve excluded where NVML can)
    )
    max_utilization_pct: float = 5.0  # SM busy time in NVML's sample window, at idle
    min_clock_fraction: float = 0.80  # SM clock under load / max (or expected) clock
    expect_sm_mhz: float | None = None  # the locked clock of a runner that pins clocks


@dataclasses.dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    detail: str


def assess(readings: dict[str, Any], limits: Limits) -> list[Finding]:
    """Judge plain NVML readings (the keys `_read_idle` and `_read_under_load` return). Pure: tested on
    CPUs."""
    procs = readings.get("processes", [])
    found = [
        Finding(
            "other processes",
            not procs,
            "none"
            if not procs
            else "; ".join(
                f"pid {p['pid']} holds {p['used_mib']:.0f} MiB"
                if p.get("used_mib") is not None
                else f"pid {p['pid']}"
                for p in procs
            )
            + " (NVML shows host pids inside containers)",
        )
    ]
    used = readings.get("memory_used_mib")
    if used is not None:
        found.append(
            Finding(
                "memory in use",
                used <= limits.max_used_mib,
                f"{used:.0f} MiB in use before the run (limit {limits.max_used_mib:.0f} MiB)",
            )
        )
    util = readings.get("utilization_pct") or []
    if util:
        found.append(
            Finding(
                "SM utilization at idle",
                max(util) <= limits.max_utilization_pct,
                f"max {max(util):.0f}% over {len(util)} samples (limit {limits.max_utilization_pct:.0f}%)",
            )
        )
    bad_idle = sorted(set(readings.get("idle_reasons", [])) & _BAD_REASONS)
    found.append(Finding("slowdown at idle", not bad_idle, ", ".join(bad_idle) or "none"))
    clocks = readings.get("load_sm_mhz") or []
    reference = limits.expect_sm_mhz or readings.get("max_sm_mhz")
    if clocks and reference:
        median = statistics.median(clocks)
        found.append(
            Finding(
                "SM clock under load",
                median >= limits.min_clock_fraction * reference,
                f"median {median:.0f} MHz over {len(clocks)} samples, "
                f"{'expected' if limits.expect_sm_mhz else 'max'} {reference:.0f} MHz "
                f"(needs >= {limits.min_clock_fraction:.0%})",
            )
        )
    bad_load = sorted(set(readings.get("load_reasons", [])) & _BAD_REASONS)
    found.append(Finding("slowdown under load", not bad_load, ", ".join(bad_load) or "none"))
    return found


def to_mib(nbytes: int) -> float:
    """NVML's memory readings are bytes (`usedGpuMemory`, `nvmlMemory_t.used` and `.total`)."""
    return nbytes / 2**20


def _query(nvml: Any, name: str, *args: Any) -> Any:
    """NVML's answer to `name(*args)` (bytes decoded), or None where the query is missing or not supported."""
    try:
        return _text(getattr(nvml, name)(*args))
    except Exception:  # noqa: BLE001 - AttributeError, NVMLError_NotSupported & co.
        return None


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _slowdowns(nvml: Any, handle: Any) -> list[str]:
    mask = _query(nvml, "nvmlDeviceGetCurrentClocksEventReasons", handle)
    if mask is None:  # the query's name before driver r535
        mask = _query(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", handle) or 0
    return [name for bit, name in enumerate(_REASONS) if mask >> bit & 1]


def _target(nvml: Any) -> tuple[int, Any]:
    """NVML's index and handle of torch's cuda:0: the first CUDA_VISIBLE_DEVICES entry (an index or a GPU-
    UUID prefix), else device 0."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        uuid = _query(nvml, "nvmlDeviceGetUUID", handle) or ""
        if first == str(i) or first.startswith("GPU-") and uuid.startswith(first):
            return i, handle
    return 0, nvml.nvmlDeviceGetHandleByIndex(0)


def _read_idle(nvml: Any, handle: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """(device record, readings) before this process creates a CUDA context, so every process seen is
    another."""
    v2 = getattr(nvml, "nvmlMemory_v2", None)  # v2 leaves out the driver's reserve: an idle GPU reads near 0
    mem = (
        _query(nvml, "nvmlDeviceGetMemoryInfo", handle, v2) if v2 else None
    ) or nvml.nvmlDeviceGetMemoryInfo(handle)
    procs = []
    for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        for p in _query(nvml, getter, handle) or []:
            used = getattr(p, "usedGpuMemory", None)  # None or a sentinel where NVML cannot say
            procs.append({"pid": p.pid, "used_mib": to_mib(used) if isinstance(used, int) else None})
    util = []
    for _ in range(5):
        util.append(getattr(_query(nvml, "nvmlDeviceGetUtilizationRates", handle), "gpu", None))
        time.sleep(0.2)
    device = {
        "name": _query(nvml, "nvmlDeviceGetName", handle),
        "uuid": _query(nvml, "nvmlDeviceGetUUID", handle),
        "pci_bus_id": _text(getattr(_query(nvml, "nvmlDeviceGetPciInfo", handle), "busId", None)),
        "memory_total_mib": to_mib(mem.total),
        "max_sm_mhz": _query(nvml, "nvmlDeviceGetMaxClockInfo", handle, nvml.NVML_CLOCK_SM),
        "max_mem_mhz": _query(nvml, "nvmlDeviceGetMaxClockInfo", handle, nvml.NVML_CLOCK_MEM),
        "applications_sm_mhz": _query(nvml, "nvmlDeviceGetApplicationsClock", handle, nvml.NVML_CLOCK_SM),
        "power_limit_w": (_query(nvml, "nvmlDeviceGetEnforcedPowerLimit", handle) or 0) / 1000 or None,
        "temperature_c": _query(nvml, "nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU),
        "persistence_mode": _query(nvml, "nvmlDeviceGetPersistenceMode", handle),
        "compute_mode": _query(nvml, "nvmlDeviceGetComputeMode", handle),
        "mig_mode": (_query(nvml, "nvmlDeviceGetMigMode", handle) or [None])[0],
    }
    readings = {
        "processes": procs,
        "memory_used_mib": to_mib(mem.used),
        "utilization_pct": [u for u in util if u is not None],
        "idle_reasons": _slowdowns(nvml, handle),
        "max_sm_mhz": device["max_sm_mhz"],
    }
    return device, readings


def _read_under_load(nvml: Any, handle: Any, seconds: float) -> dict[str, Any]:
    """SM clock and slowdown reasons sampled while a launch-bound load of our own (small GEMMs and elementwise
    kernels back to back, as in the latency benchmarks) keeps the GPU busy without reaching its power
    limit."""
    import torch

    a = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)

    def burst() -> None:
        for _ in range(25):
            (a @ b).mul_(0.5)
        torch.cuda.synchronize()  # the clock read belongs to this burst, not to a queue of earlier ones

    for _ in range(20):  # let the clock ramp from idle
        burst()
    clocks, reasons = [], set()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        burst()
        clocks.append(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
        reasons.update(_slowdowns(nvml, handle))
    return {
        "load_sm_mhz": clocks,
        "load_reasons": sorted(reasons),
        "temperature_after_c": _query(nvml, "nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU),
    }


def _software() -> dict[str, Any]:
    import torch

    try:
        import triton
    except ImportError:
        triton = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", None),
        "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "triton": getattr(triton, "__version__", None),
        "cache_key_factors": _cache_key_factors(),
    }


def _cache_key_factors() -> dict[str, Any]:
    """What keys pieceworks' compile cache besides the graph and the config: the software and GPU, and the
    digest of the global Inductor configuration (its error, where it cannot be digested)."""
    import pieceworks.core as core

    try:
        inductor = core.inductor_config_factors()
    except core.UnkeyableConfigError as exc:
        inductor = f"unkeyable: {exc}"
    return {"software": core.software_factors(), "inductor_config": inductor}


def _inspect(nvml: Any, record: dict[str, Any], expect_sm_mhz: float | None) -> list[Finding] | None:
    """Fill `record` with what NVML and torch say; the findings, or None when torch sees no CUDA device."""
    index, handle = _target(nvml)
    record["driver"] = _query(nvml, "nvmlSystemGetDriverVersion")
    cuda = _query(nvml, "nvmlSystemGetCudaDriverVersion_v2") or _query(nvml, "nvmlSystemGetCudaDriverVersion")
    record["cuda_driver"] = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None
    device, readings = _read_idle(nvml, handle)  # before any CUDA context of ours
    record.update(gpu={"nvml_index": index, **device}, idle=readings)
    import torch

    if not torch.cuda.is_available():
        print(
            f"preflight: torch {torch.__version__} sees no CUDA device (NVML sees {device['name']}): "
            "a CPU build of torch, or CUDA_VISIBLE_DEVICES hides it",
            file=sys.stderr,
        )
        return None
    record["software"] = _software()
    props = torch.cuda.get_device_properties(0)
    record["gpu"].update(
        torch_name=props.name,
        torch_uuid=str(getattr(props, "uuid", "")),
        capability=f"{props.major}.{props.minor}",
    )
    record["load"] = _read_under_load(nvml, handle, 1.0)
    return assess({**readings, **record["load"]}, Limits(expect_sm_mhz=expect_sm_mhz))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pieceworks.gate.preflight", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--out", help="write the record as JSON here")
    parser.add_argument(
        "--allow-busy",
        "--force",
        action="store_true",
        help="record and warn, but exit 0 on a busy or throttled GPU (humans only)",
    )
    parser.add_argument(
        "--expect-sm-mhz", type=float, default=None, help="the locked SM clock of this runner"
    )
    args = parser.parse_args(argv)
    record: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIXES)},
    }

    def finish(status: int, verdict: str) -> int:
        record.update(verdict=verdict, exit_status=status)
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                json.dump(record, f, indent=2, default=str)
        return status

    try:
        import pynvml as nvml

        nvml.nvmlInit()
    except ImportError:
        print(
            "preflight: NVML is not importable: pip install nvidia-ml-py (the bench extra); cannot check the "
            "GPU",
            file=sys.stderr,
        )
        return finish(NO_GPU, "no NVML")
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        print(
            f"preflight: NVML cannot start ({exc}): no NVIDIA driver here; GPU benchmarks need a GPU runner",
            file=sys.stderr,
        )
        return finish(NO_GPU, "no GPU")
    try:
        findings = _inspect(nvml, record, args.expect_sm_mhz)
    finally:
        _query(nvml, "nvmlShutdown")
    if findings is None:
        return finish(NO_GPU, "no CUDA in torch")
    record["checks"] = [dataclasses.asdict(f) for f in findings]
    gpu, sw = record["gpu"], record["software"]
    print(
        f"preflight: {gpu['name']} ({gpu['uuid']}), driver {record['driver']}, CUDA {record['cuda_driver']} "
        f"(runtime {sw['cuda_runtime']}), torch {sw['torch']}, Triton {sw['triton']}, Python {sw['python']}"
    )
    for f in findings:
        print(f"preflight: {'ok  ' if f.ok else 'FAIL'} {f.check}: {f.detail}")
    if all(f.ok for f in findings):
        return finish(READY, "ready")
    if args.allow_busy:
        print(
            "preflight: WARNING: the GPU is busy or throttled; going on because of --allow-busy: "
            "these numbers are not comparable with a clean run",
            file=sys.stderr,
        )
        return finish(READY, "busy, allowed")
    print(
        "preflight: refusing to benchmark: numbers taken now would measure the other load or the slowdown, "
        "not the code. Wait for the GPU to be idle and cool (nvidia-smi), or pass --allow-busy to go on "
        "anyway.",
        file=sys.stderr,
    )
    return finish(BUSY, "busy")


if __name__ == "__main__":
    sys.exit(main())
