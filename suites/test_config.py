"""CompilationConfig: validation at construction, derived ranges, and the hash."""

from __future__ import annotations

import pytest

import pieceworks
from pieceworks import CompilationConfig, ConfigError, CUDAGraphMode


@pytest.mark.parametrize(
    "kwargs, field, words",
    [
        ({"splitting_ops": ["attention"]}, "splitting_ops", "namespace::op"),
        ({"splitting_ops": "silly::attention"}, "splitting_ops", "list of op names"),
        ({"splitting_ops": ["silly::attention.default.x"]}, "splitting_ops", "namespace::op"),
        ({"compile_ranges": [64, 8]}, "compile_ranges", "strictly increasing"),
        ({"compile_ranges": [8, 8]}, "compile_ranges", "strictly increasing"),
        ({"compile_ranges": [0, 8]}, "compile_ranges", "positive"),
        ({"compile_ranges": [-4]}, "compile_ranges", "positive"),
        ({"compile_ranges": [100], "max_num_batched_tokens": 64}, "compile_ranges", "above max_num_batched_tokens"),
        ({"compile_sizes": [4, 10_000]}, "compile_sizes", "outside every compile range"),
        ({"cudagraph_capture_sizes": [1, 1024], "max_num_batched_tokens": 512}, "cudagraph_capture_sizes",
         "above the largest compile range"),
        ({"cudagraph_capture_sizes": [1.5]}, "cudagraph_capture_sizes", "list of int"),
        ({"compile_sizes": "4"}, "compile_sizes", "list of int"),
        ({"compile_sizes": [True]}, "compile_sizes", "list of int"),
        ({"cudagraph_mode": "SOMETIMES"}, "cudagraph_mode", "unknown mode"),
        ({"compiler": "tvm"}, "compiler", '"inductor" or "eager"'),
        ({"cudagraph_num_warmups": -1}, "cudagraph_num_warmups", ">= 0"),
        ({"inductor_compile_config": {"x": object()}}, "inductor_compile_config", "JSON"),
        ({"cache_enabled": "yes"}, "cache_enabled", "bool"),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens", "positive"),
    ],
)
def test_bad_field_is_named_with_a_fix(kwargs, field, words):
    with pytest.raises(ConfigError) as info:
        CompilationConfig(**kwargs)
    message = str(info.value)
    assert f"CompilationConfig.{field}=" in message
    assert words in message
    assert "Fix:" in message


def test_ranges_follow_vllm_endpoints():
    config = CompilationConfig(compile_ranges=[8, 64], max_num_batched_tokens=512)
    assert config.ranges() == [(1, 8), (9, 64), (65, 512)]
    assert CompilationConfig(max_num_batched_tokens=100).ranges() == [(1, 100)]
    assert CompilationConfig(compile_ranges=[100], max_num_batched_tokens=100).ranges() == [(1, 100)]


def test_default_capture_sizes_are_vllms_51():
    sizes = CompilationConfig().cudagraph_capture_sizes
    assert len(sizes) == 51 and sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 512
    assert CompilationConfig(max_num_batched_tokens=64).cudagraph_capture_sizes[-1] == 64


def test_mode_accepts_names_and_has_vllm_values():
    assert CompilationConfig(cudagraph_mode="full").cudagraph_mode is CUDAGraphMode.FULL
    assert [m.value for m in CUDAGraphMode] == [0, 1, 2, 3]


def test_hash_covers_code_factors_and_nothing_else(tmp_path):
    base = CompilationConfig(splitting_ops=["silly::attention"])
    assert base.compute_hash() == CompilationConfig(splitting_ops=["silly::attention"]).compute_hash()
    changed = [
        {"splitting_ops": ["silly::other"]},
        {"compile_ranges": [8]},
        {"compile_sizes": [4]},
        {"max_num_batched_tokens": 4096},
        {"compiler": "eager"},
        {"inductor_compile_config": {"max_autotune": True}},
    ]
    for extra in changed:
        other = CompilationConfig(**{"splitting_ops": ["silly::attention"], **extra})
        assert other.compute_hash() != base.compute_hash(), extra
    unchanged = [{"cache_dir": str(tmp_path)}, {"cudagraph_mode": "NONE"}, {"cache_enabled": False},
                 {"cudagraph_capture_sizes": [1, 2]}]
    for extra in unchanged:
        other = CompilationConfig(**{"splitting_ops": ["silly::attention"], **extra})
        assert other.compute_hash() == base.compute_hash(), extra


def test_cache_dir_and_disable_switch(monkeypatch, tmp_path):
    monkeypatch.delenv("PIECEWORKS_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert CompilationConfig().resolved_cache_dir() == str(tmp_path / "pieceworks")
    assert CompilationConfig(cache_dir=tmp_path / "x").resolved_cache_dir() == str(tmp_path / "x")
    assert CompilationConfig().cache_active()
    monkeypatch.setenv("PIECEWORKS_DISABLE_CACHE", "1")
    assert not CompilationConfig().cache_active()
    monkeypatch.delenv("PIECEWORKS_DISABLE_CACHE")
    assert not CompilationConfig(cache_enabled=False).cache_active()
    assert not CompilationConfig(compiler="eager").cache_active()


def test_public_names():
    for name in ["CompilationConfig", "CUDAGraphMode", "compile", "Backend", "split_graph", "counters"]:
        assert hasattr(pieceworks, name), name
