"""The asv benchmarks the report reads, in one table: `BENCHMARKS` names each section's asv classes
(`module.Class` of suites/benchmarks) by what the section calls them, `TRACKS` the `track_` methods it reads
of them (none: every benchmark of the class). suites/test_report.py holds each name against suites/benchmarks:
renaming a benchmark fails that test instead of silently emptying a section."""

from __future__ import annotations

from typing import Any

BENCHMARKS: dict[str, dict[Any, str]] = {
    "latency": {  # (model, dtype): class
        ("toy_llama", "bfloat16"): "latency.ToyLlamaBfloat16",
        ("toy_llama", "float32"): "latency.ToyLlamaFloat32",
        ("silly", "bfloat16"): "latency.SillyBfloat16",
        ("silly", "float32"): "latency.SillyFloat32",
        ("llama_1b", "bfloat16"): "latency.Llama1BBfloat16",
        ("llama_8b_4l", "bfloat16"): "latency.Llama8B4LayersBfloat16",
        ("llama_8b_4l_tp2", "bfloat16"): "tensor_parallel.TensorParallelLlama8B4LayersBfloat16",  # 2 GPUs
    },
    "memory": {  # (model, title): class
        ("toy_llama", "ToyLlama 12 layers"): "memory.CaptureMemory",
        ("llama_1b", "Llama 1B"): "memory.CaptureMemoryLlama1B",
        ("llama_8b", "Llama 8B (32 layers)"): "memory.CaptureMemoryLlama8B",
    },
    "starts": {  # (details file, model): class
        ("compile", "ToyLlama 12 layers"): "compile.CompileStart",
        ("compile_llama_1b", "Llama-3.2-1B's shape (bfloat16)"): "compile.CompileStartLlama1B",
        ("compile_llama_8b", "Llama-3.1-8B's shape, 32 layers (bfloat16)"): "compile.CompileStartLlama8B",
        ("compile_user_model", "User's model"): "compile.CompileStartUserModel",
    },
    "host_overhead": {"cpu": "host_overhead.HostOverheadCPU"},
    "dispatch": {"sweeps": "dispatch.Dispatch"},
    "code_size": {"core": "code_size.ReferenceCore", "model": "code_size.ModelLayer"},
}
TRACKS: dict[str, tuple[str, ...]] = {
    "latency": ("median_us", "iqr_us"),
    "memory": (
        "pool_mib",
        "estimate_mib",
        "reserved_delta_mib",
        "nvml_used_delta_mib",
        "unshared_pool_mib",
        "unshared_reserved_delta_mib",
        "unshared_nvml_used_delta_mib",
        "capture_seconds",
    ),
    "starts": ("first_call_seconds", "process_seconds", "inductor_compiles", "artifacts_loaded"),
    "host_overhead": (
        "forward_us",
        "overhead_per_forward_us",
        "overhead_per_piece_us",
        "overhead_per_piece_min_us",
        "overhead_per_piece_max_us",
    ),
    "dispatch": (),
    "code_size": ("lines",),
}
