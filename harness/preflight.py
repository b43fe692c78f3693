"""Preflight of a GPU benchmark run: record what the numbers depend on, refuse a GPU that would skew them.

`python -m pieceworks.harness.preflight [--out FILE] [--allow-busy]` records the GPU (name, UUID, memory,
clocks, power limit, persistence, compute and MIG mode), driver and CUDA versions, torch, Triton, Python, the
compile-cache key factors (pieceworks.key) and the environment variables that change compiled code, and
checks through NVML, before this process touches CUDA, that no other process holds memory or SM time on the GPU,
then, under a short load of its own, that the SM clock reaches its maximum (or --expect-sm-mhz, for runners with
locked clocks) and no thermal, power-brake or hardware slowdown is active. The load is launch-bound, like the
benchmarks (small kernels back to back): a dense GEMM load would reach the board's power limit and lower the clock
on a healthy GPU (seen on an H100: 1980 MHz falling to 1440 MHz after ~0.5 s of 4096^3 bf16 GEMMs, with no
slowdown reason reported), which says nothing about the latency benchmarks, whose kernels never draw that power.

Exit status: 0 ready; 1 no usable GPU (no CUDA device, NVML missing); 75 (EX_TEMPFAIL, try later) busy or
throttled, with one line per finding. --allow-busy records the findings, warns, and exits 0: for a human who
knows why; CI never passes it.
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

# NVML clock-event ("throttle") reason bits (nvml.h, stable since r4xx).
_REASONS = {
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Reasons that mean the hardware is protecting itself: numbers taken now are not this GPU's numbers.
_BAD_REASONS = {"hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown"}
_ENV_PREFIXES = ("PIECEWORKS_", "TORCHINDUCTOR_", "TORCH_", "TRITON_", "CUDA_", "NVIDIA_", "PYTORCH_", "CUBLAS")


@dataclasses.dataclass(frozen=True)
class Limits:
    max_used_mib: float = 1024.0  # device memory in use before we start (driver reserve excluded where NVML can)
    max_utilization_pct: float = 5.0  # SM busy time in NVML's sample window, at idle
    min_clock_fraction: float = 0.80  # SM clock under load / max (or expected) clock
    expect_sm_mhz: float | None = None  # the locked clock of a runner that pins clocks


@dataclasses.dataclass(frozen=True)
class Finding:
    check: str
    ok: bool
    detail: str


def assess(readings: dict[str, Any], limits: Limits) -> list[Finding]:
    """Judge plain NVML readings (see `_read_idle` and `_read_under_load` for the keys). Pure: tested on CPUs."""
    found = []
    procs = readings.get("processes", [])
    found.append(Finding("other processes", not procs, "none" if not procs else "; ".join(
        f"pid {p['pid']} holds {p['used_mib']:.0f} MiB" if p.get("used_mib") is not None else f"pid {p['pid']}"
        for p in procs) + " (NVML shows host pids inside containers)"))
    used = readings.get("memory_used_mib")
    if used is not None:
        found.append(Finding("memory in use", used <= limits.max_used_mib,
                             f"{used:.0f} MiB in use before the run (limit {limits.max_used_mib:.0f} MiB)"))
    util = readings.get("utilization_pct") or []
    if util:
        found.append(Finding("SM utilization at idle", max(util) <= limits.max_utilization_pct,
                             f"max {max(util):.0f}% over {len(util)} samples (limit {limits.max_utilization_pct:.0f}%)"))
    bad_idle = sorted(set(readings.get("idle_reasons", [])) & _BAD_REASONS)
    found.append(Finding("slowdown at idle", not bad_idle, ", ".join(bad_idle) or "none"))
    clocks = readings.get("load_sm_mhz") or []
    reference = limits.expect_sm_mhz or readings.get("max_sm_mhz")
    if clocks and reference:
        median = statistics.median(clocks)
        found.append(Finding("SM clock under load", median >= limits.min_clock_fraction * reference,
                             f"median {median:.0f} MHz over {len(clocks)} samples, "
                             f"{'expected' if limits.expect_sm_mhz else 'max'} {reference:.0f} MHz "
                             f"(needs >= {limits.min_clock_fraction:.0%})"))
    bad_load = sorted(set(readings.get("load_reasons", [])) & _BAD_REASONS)
    found.append(Finding("slowdown under load", not bad_load, ", ".join(bad_load) or "none"))
    return found


def _reasons(mask: int) -> list[str]:
    return [name for bit, name in _REASONS.items() if mask & bit]


def _call(fn, *args, default=None):
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - NVML raises NVMLError_NotSupported & co. per device and driver
        return default


def _opt(nvml, name: str, *args, default=None):
    """An NVML query that this driver or nvidia-ml-py may lack: its answer, or `default`."""
    fn = getattr(nvml, name, None)
    return default if fn is None else _call(fn, *args, default=default)


def _target_nvml_index(nvml) -> int:
    """The NVML index of torch's cuda:0: the first CUDA_VISIBLE_DEVICES entry (index or GPU- UUID), else 0."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if first.isdigit():
        return int(first)
    if first.startswith("GPU-"):
        for i in range(nvml.nvmlDeviceGetCount()):
            uuid = nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))
            if (uuid.decode() if isinstance(uuid, bytes) else uuid).startswith(first):
                return i
    return 0


def _text(value: Any) -> Any:
    return value.decode() if isinstance(value, bytes) else value


def _read_idle(nvml, handle) -> tuple[dict[str, Any], dict[str, Any]]:
    """(device record, readings) before this process creates a CUDA context, so every process seen is another."""
    mem = None
    if hasattr(nvml, "nvmlMemory_v2"):  # v2 leaves out the driver's reserve, so an idle GPU reads near 0
        mem = _opt(nvml, "nvmlDeviceGetMemoryInfo", handle, nvml.nvmlMemory_v2)
    mem = mem or nvml.nvmlDeviceGetMemoryInfo(handle)
    procs = []
    for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
        for p in _call(getattr(nvml, getter), handle, default=[]) or []:
            used = getattr(p, "usedGpuMemory", None)
            procs.append({"pid": p.pid, "used_mib": used / 2**20 if isinstance(used, int) else None})
    util = []
    for _ in range(5):
        rates = _opt(nvml, "nvmlDeviceGetUtilizationRates", handle)
        if rates is not None:
            util.append(rates.gpu)
        time.sleep(0.2)
    reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    device = {
        "name": _text(nvml.nvmlDeviceGetName(handle)),
        "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
        "pci_bus_id": _text(getattr(_opt(nvml, "nvmlDeviceGetPciInfo", handle), "busId", None)),
        "memory_total_mib": mem.total / 2**20,
        "max_sm_mhz": _opt(nvml, "nvmlDeviceGetMaxClockInfo", handle, nvml.NVML_CLOCK_SM),
        "max_mem_mhz": _opt(nvml, "nvmlDeviceGetMaxClockInfo", handle, nvml.NVML_CLOCK_MEM),
        "applications_sm_mhz": _opt(nvml, "nvmlDeviceGetApplicationsClock", handle, nvml.NVML_CLOCK_SM),
        "power_limit_w": (_opt(nvml, "nvmlDeviceGetEnforcedPowerLimit", handle) or 0) / 1000 or None,
        "temperature_c": _opt(nvml, "nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU),
        "persistence_mode": _opt(nvml, "nvmlDeviceGetPersistenceMode", handle),
        "compute_mode": _opt(nvml, "nvmlDeviceGetComputeMode", handle),
        "mig_mode": (_opt(nvml, "nvmlDeviceGetMigMode", handle) or [None])[0],
    }
    readings = {
        "processes": procs,
        "memory_used_mib": mem.used / 2**20,
        "utilization_pct": util,
        "idle_reasons": _reasons(_call(reasons_fn, handle, default=0) or 0),
        "max_sm_mhz": device["max_sm_mhz"],
    }
    return device, readings


def _read_under_load(nvml, handle, seconds: float) -> dict[str, Any]:
    """SM clock and slowdown reasons sampled while a launch-bound load of our own (small GEMMs and elementwise
    kernels back to back, as in the latency benchmarks) keeps the GPU busy without reaching its power limit."""
    import torch

    reasons_fn = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or nvml.nvmlDeviceGetCurrentClocksThrottleReasons
    a = torch.randn(256, 1024, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)

    def burst() -> None:
        for _ in range(25):
            (a @ b).mul_(0.5)

    for _ in range(20):  # let the clock ramp from idle
        burst()
    torch.cuda.synchronize()
    clocks, reasons = [], set()
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        burst()
        torch.cuda.synchronize()  # the clock read belongs to this burst, not to a queue of earlier ones
        clocks.append(nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM))
        reasons.update(_reasons(_call(reasons_fn, handle, default=0) or 0))
    torch.cuda.synchronize()
    return {"load_sm_mhz": clocks, "load_reasons": sorted(reasons),
            "temperature_after_c": _opt(nvml, "nvmlDeviceGetTemperature", handle, nvml.NVML_TEMPERATURE_GPU)}


def _software() -> dict[str, Any]:
    import torch

    record: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_git": getattr(torch.version, "git_version", None),
        "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
    }
    try:
        import triton

        record["triton"] = triton.__version__
    except ImportError:
        record["triton"] = None
    import pieceworks.key as key  # the factors that key the compile cache

    factors = {}
    for name in ("software_factors", "environment_factors", "inductor_config_factors"):
        fn = getattr(key, name, None)
        if fn is not None:
            factors[name] = _call(fn, default="(failed)")
    record["cache_key_factors"] = factors
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pieceworks.harness.preflight", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="write the record as JSON here")
    parser.add_argument("--allow-busy", "--force", action="store_true",
                        help="record and warn, but exit 0 on a busy or throttled GPU (humans only)")
    parser.add_argument("--max-used-mib", type=float, default=Limits.max_used_mib)
    parser.add_argument("--max-utilization", type=float, default=Limits.max_utilization_pct)
    parser.add_argument("--min-clock-fraction", type=float, default=Limits.min_clock_fraction)
    parser.add_argument("--expect-sm-mhz", type=float, default=None, help="the locked SM clock of this runner")
    parser.add_argument("--load-seconds", type=float, default=1.0)
    args = parser.parse_args(argv)
    limits = Limits(args.max_used_mib, args.max_utilization, args.min_clock_fraction, args.expect_sm_mhz)
    record: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(_ENV_PREFIXES)},
    }

    def finish(status: int, verdict: str) -> int:
        record["verdict"] = verdict
        record["exit_status"] = status
        if args.out:
            with open(args.out, "w", encoding="utf-8") as f:
                json.dump(record, f, indent=2, default=str)
        return status

    try:
        import pynvml as nvml
    except ImportError:
        print("preflight: NVML is not importable: pip install nvidia-ml-py (the bench extra); cannot check the GPU",
              file=sys.stderr)
        return finish(NO_GPU, "no NVML")
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, _DriverNotLoaded, ...
        print(f"preflight: NVML cannot start ({exc}): no NVIDIA driver here; GPU benchmarks need a GPU runner",
              file=sys.stderr)
        return finish(NO_GPU, "no GPU")
    try:
        index = _target_nvml_index(nvml)
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        record["driver"] = _text(nvml.nvmlSystemGetDriverVersion())
        cuda_driver = _opt(nvml, "nvmlSystemGetCudaDriverVersion_v2") or _opt(nvml, "nvmlSystemGetCudaDriverVersion")
        record["cuda_driver"] = f"{cuda_driver // 1000}.{cuda_driver % 1000 // 10}" if cuda_driver else None
        device, readings = _read_idle(nvml, handle)  # before any CUDA context of ours
        record["gpu"] = {"nvml_index": index, **device}
        record["idle"] = readings

        import torch

        if not torch.cuda.is_available():
            print(f"preflight: torch {torch.__version__} sees no CUDA device (NVML sees {device['name']}): "
                  "a CPU build of torch, or CUDA_VISIBLE_DEVICES hides it", file=sys.stderr)
            return finish(NO_GPU, "no CUDA in torch")
        record["software"] = _software()
        props = torch.cuda.get_device_properties(0)
        record["gpu"]["torch_name"] = props.name
        record["gpu"]["torch_uuid"] = str(getattr(props, "uuid", ""))
        record["gpu"]["capability"] = f"{props.major}.{props.minor}"
        load = _read_under_load(nvml, handle, args.load_seconds)
        record["load"] = load
        findings = assess({**readings, **load}, limits)
    finally:
        _opt(nvml, "nvmlShutdown")
    record["checks"] = [dataclasses.asdict(f) for f in findings]
    gpu, sw = record["gpu"], record["software"]
    print(f"preflight: {gpu['name']} ({gpu['uuid']}), driver {record['driver']}, CUDA {record['cuda_driver']} "
          f"(runtime {sw['cuda_runtime']}), torch {sw['torch']}, Triton {sw['triton']}, Python {sw['python']}")
    for f in findings:
        print(f"preflight: {'ok  ' if f.ok else 'FAIL'} {f.check}: {f.detail}")
    if all(f.ok for f in findings):
        return finish(READY, "ready")
    if args.allow_busy:
        print("preflight: WARNING: the GPU is busy or throttled; going on because of --allow-busy: "
              "these numbers are not comparable with a clean run", file=sys.stderr)
        return finish(READY, "busy, allowed")
    print("preflight: refusing to benchmark: numbers taken now would measure the other load or the slowdown, not "
          "the code. Wait for the GPU to be idle and cool (nvidia-smi), or pass --allow-busy to go on anyway.",
          file=sys.stderr)
    return finish(BUSY, "busy")


if __name__ == "__main__":
    sys.exit(main())
