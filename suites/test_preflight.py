"""The preflight refuses a busy or throttled GPU with exit 75, records the environment, and runs for real on a
GPU.

The judging (`assess`) is pure and tested on readings as NVML reports them; the command's exit statuses are
tested with a stand-in NVML module and the CUDA load replaced, so they run on any machine; the last test reads
a real GPU.
"""

from __future__ import annotations

import json
import sys
import types

import pytest

from pieceworks.gate import preflight
from pieceworks.gate.preflight import BUSY, NO_GPU, READY, Limits, assess

H100_MAX_SM_MHZ = 1980


def idle_h100(**changes):
    """Readings of an idle H100 as NVML gives them, then a matmul load at full clock."""
    readings = {
        "processes": [],
        "memory_used_mib": 0.0,
        "utilization_pct": [0, 0, 0, 0, 0],
        "idle_reasons": ["gpu_idle"],
        "max_sm_mhz": H100_MAX_SM_MHZ,
        "load_sm_mhz": [1980, 1980, 1965, 1980],
        "load_reasons": [],
    }
    readings.update(changes)
    return readings


def failed(findings):
    return {f.check: f.detail for f in findings if not f.ok}


def test_an_idle_gpu_at_full_clock_is_ready():
    assert failed(assess(idle_h100(), Limits())) == {}
    # a power cap that costs some clock is the GPU working as designed, not a slowdown
    assert failed(assess(idle_h100(load_sm_mhz=[1755] * 8, load_reasons=["sw_power_cap"]), Limits())) == {}


def test_another_process_on_the_gpu_is_busy():
    bad = failed(assess(idle_h100(processes=[{"pid": 4242, "used_mib": 5120.0}]), Limits()))
    assert list(bad) == ["other processes"] and "pid 4242 holds 5120 MiB" in bad["other processes"]


def test_memory_held_by_an_invisible_process_is_busy():
    bad = failed(assess(idle_h100(memory_used_mib=30000.0), Limits()))  # another container's process: no pid
    assert list(bad) == ["memory in use"] and "30000 MiB" in bad["memory in use"]


def test_sm_time_at_idle_is_busy():
    bad = failed(assess(idle_h100(utilization_pct=[0, 40, 100, 100, 60]), Limits()))
    assert list(bad) == ["SM utilization at idle"] and "max 100%" in bad["SM utilization at idle"]


def test_a_clock_held_below_its_maximum_is_throttled():
    bad = failed(assess(idle_h100(load_sm_mhz=[1200] * 8), Limits()))
    assert list(bad) == ["SM clock under load"] and "median 1200 MHz" in bad["SM clock under load"]
    # a runner that locks its clocks says so, and its locked clock is then the reference
    assert failed(assess(idle_h100(load_sm_mhz=[1410] * 8), Limits(expect_sm_mhz=1410))) == {}
    assert "SM clock under load" in failed(
        assess(idle_h100(load_sm_mhz=[1000] * 8), Limits(expect_sm_mhz=1410))
    )


def test_thermal_or_power_brake_slowdown_is_throttled():
    bad = failed(assess(idle_h100(load_reasons=["hw_thermal_slowdown", "sw_power_cap"]), Limits()))
    assert bad == {"slowdown under load": "hw_thermal_slowdown"}
    bad = failed(assess(idle_h100(idle_reasons=["gpu_idle", "hw_power_brake_slowdown"]), Limits()))
    assert bad == {"slowdown at idle": "hw_power_brake_slowdown"}


class _FakeNVML(types.SimpleNamespace):
    """The part of pynvml the preflight calls, answering with one device's readings."""

    NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_TEMPERATURE_GPU = 0, 2, 0

    def __init__(self, processes=(), used_mib=0.0, util=0):
        super().__init__()
        self._procs = [types.SimpleNamespace(pid=p, usedGpuMemory=4 << 30) for p in processes]
        self._used, self._util = used_mib, util

    def nvmlInit(self):
        pass

    def nvmlShutdown(self):
        pass

    def nvmlDeviceGetCount(self):
        return 1

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlSystemGetDriverVersion(self):
        return "580.159.04"

    def nvmlSystemGetCudaDriverVersion_v2(self):
        return 13000

    def nvmlDeviceGetName(self, h):
        return "NVIDIA H100 80GB HBM3"

    def nvmlDeviceGetUUID(self, h):
        return "GPU-00000000-1111-2222-3333-444444444444"

    def nvmlDeviceGetMemoryInfo(self, h, version=None):
        return types.SimpleNamespace(total=80 << 30, used=int(self._used * 2**20))

    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return self._procs

    def nvmlDeviceGetGraphicsRunningProcesses(self, h):
        return []

    def nvmlDeviceGetUtilizationRates(self, h):
        return types.SimpleNamespace(gpu=self._util, memory=0)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, h):
        return 0x1

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        return H100_MAX_SM_MHZ if clock == self.NVML_CLOCK_SM else 2619

    def nvmlDeviceGetClockInfo(self, h, clock):
        return H100_MAX_SM_MHZ

    def nvmlDeviceGetTemperature(self, h, sensor):
        return 34


@pytest.fixture
def fake_gpu(monkeypatch):
    """Install a fake NVML; replace the CUDA parts (load, device properties, software record) of the
    command."""
    import torch

    monkeypatch.setattr(preflight.time, "sleep", lambda s: None)
    monkeypatch.setattr(
        preflight, "_read_under_load", lambda nvml, h, s: {"load_sm_mhz": [1980] * 4, "load_reasons": []}
    )
    monkeypatch.setattr(
        preflight,
        "_software",
        lambda: {
            "torch": "2.11.0",
            "triton": "3.6.0",
            "python": "3.12.3",
            "cuda_runtime": "13.0",
            "cache_key_factors": {},
        },
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda i: types.SimpleNamespace(name="NVIDIA H100 80GB HBM3", major=9, minor=0, uuid="x"),
    )

    def install(**kwargs):
        monkeypatch.setitem(sys.modules, "pynvml", _FakeNVML(**kwargs))

    return install


def test_command_exit_statuses_and_record(fake_gpu, tmp_path, capfd):
    out = tmp_path / "preflight.json"
    fake_gpu()
    assert preflight.main(["--out", str(out)]) == READY
    record = json.loads(out.read_text())
    assert (
        record["verdict"] == "ready" and record["driver"] == "580.159.04" and record["cuda_driver"] == "13.0"
    )
    assert record["gpu"]["name"] == "NVIDIA H100 80GB HBM3" and all(c["ok"] for c in record["checks"])

    fake_gpu(processes=[4242])
    assert preflight.main(["--out", str(out)]) == BUSY == 75
    err = capfd.readouterr()
    assert "FAIL other processes: pid 4242 holds 4096 MiB" in err.out and "refusing to benchmark" in err.err
    assert json.loads(out.read_text())["verdict"] == "busy"

    assert preflight.main(["--allow-busy", "--out", str(out)]) == READY
    assert (
        "--allow-busy" in capfd.readouterr().err and json.loads(out.read_text())["verdict"] == "busy, allowed"
    )


def test_memory_held_on_a_busy_gpu_is_read_in_mib_and_refused(fake_gpu, tmp_path, capfd):
    """NVML reports bytes: 30000 MiB held by a process NVML cannot name (another container's) must read as
    30000 MiB, over the 1024 MiB limit, not as 29 (GiB) or 30 (decimal GB) under it."""
    out = tmp_path / "preflight.json"
    fake_gpu(used_mib=30000.0)
    assert preflight.main(["--out", str(out)]) == BUSY
    assert "FAIL memory in use: 30000 MiB in use before the run (limit 1024 MiB)" in capfd.readouterr().out
    record = json.loads(out.read_text())
    assert record["idle"]["memory_used_mib"] == 30000.0 and record["gpu"]["memory_total_mib"] == 80 * 1024


def test_no_nvml_or_no_cuda_exits_1_saying_why(monkeypatch, tmp_path, capfd):
    import torch

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    assert preflight.main([]) == NO_GPU == 1
    assert "pip install nvidia-ml-py" in capfd.readouterr().err

    monkeypatch.setitem(sys.modules, "pynvml", _FakeNVML())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "record.json"
    assert preflight.main(["--out", str(out)]) == NO_GPU
    assert "sees no CUDA device (NVML sees NVIDIA H100 80GB HBM3)" in capfd.readouterr().err
    assert json.loads(out.read_text())["verdict"] == "no CUDA in torch"


@pytest.mark.gpu
@pytest.mark.timeout(120)
def test_preflight_reads_this_gpu(tmp_path):
    """On a GPU runner: the record names the GPU, driver, versions and cache-key factors; exit 0 or 75
    only."""
    import subprocess

    out = tmp_path / "preflight.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pieceworks.gate.preflight", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=110,
    )
    assert proc.returncode in (READY, BUSY), proc.stdout + proc.stderr
    record = json.loads(out.read_text())
    assert record["gpu"]["uuid"].startswith(("GPU-", "MIG-")) and record["driver"]
    assert record["gpu"]["max_sm_mhz"] > 0 and len(record["load"]["load_sm_mhz"]) > 0
    assert record["software"]["torch"] and record["software"]["cache_key_factors"]
    assert (proc.returncode == READY) == all(c["ok"] for c in record["checks"])
