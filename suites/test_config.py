"""CompilationConfig: validation at construction, derived ranges, and the hash."""

from __future__ import annotations

import dataclasses

import pytest
import torch

import pieceworks
from pieceworks import CompilationConfig, ConfigError, CUDAGraphMode
from pieceworks.harness.models import toy as models
from pieceworks.progress import progress


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
        (
            {"compile_ranges": [100], "max_num_batched_tokens": 64},
            "compile_ranges",
            "above max_num_batched_tokens",
        ),
        ({"compile_sizes": [4, 10_000]}, "compile_sizes", "outside every compile range"),
        (
            {"cudagraph_capture_sizes": [1, 1024], "max_num_batched_tokens": 512},
            "cudagraph_capture_sizes",
            "above the largest compile range",
        ),
        ({"cudagraph_capture_sizes": [1.5]}, "cudagraph_capture_sizes", "list of int"),
        ({"compile_sizes": "4"}, "compile_sizes", "list of int"),
        ({"compile_sizes": [True]}, "compile_sizes", "list of int"),
        ({"cudagraph_mode": "SOMETIMES"}, "cudagraph_mode", "unknown mode"),
        ({"compiler": "tvm"}, "compiler", '"inductor" or "eager"'),
        ({"cudagraph_num_warmups": -1}, "cudagraph_num_warmups", ">= 0"),
        ({"inductor_compile_config": {"max_autotune": object()}}, "inductor_compile_config", "JSON"),
        (
            {"inductor_compile_config": {"max_autotun": True}},
            "inductor_compile_config",
            "'max_autotun' is not an Inductor config option. Fix: use one of ['max_autotune'",
        ),
        ({"cudagraph_capture_sizes": []}, "cudagraph_capture_sizes", "cudagraph_mode=PIECEWISE"),
        (
            {"cudagraph_capture_sizes": [], "cudagraph_mode": "FULL"},
            "cudagraph_capture_sizes",
            "cudagraph_mode=FULL",
        ),
        (
            {"compile_sizes": ["capture_sizes"]},
            "compile_sizes",
            '"cudagraph_capture_sizes" for every capture size',
        ),
        ({"cache_enabled": "yes"}, "cache_enabled", "bool"),
        (
            {"inductor_compile_config": {"max_autotune": "yes"}},
            "inductor_compile_config",
            "'max_autotune' takes bool, not 'yes' (str). Fix: pass a bool, e.g. its default False",
        ),
        (
            {"inductor_compile_config": {"compile_threads": "4"}},
            "inductor_compile_config",
            "'compile_threads' takes int | None, not '4' (str)",
        ),
        (
            {"inductor_compile_config": {"max_autotune_gemm_backends": ["ATEN"]}},
            "inductor_compile_config",
            "'max_autotune_gemm_backends' takes str, not ['ATEN'] (list)",
        ),
        ({"max_num_batched_tokens": 0}, "max_num_batched_tokens", "positive"),
        ({"level": 3}, "level", "pieceworks has no such field"),  # a vLLM field pieceworks lacks
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


@pytest.mark.parametrize(
    "limit, tail",
    [
        (257, [248, 256, 257]),
        (100, [88, 96, 100]),
        (3, [1, 2, 3]),
        (300, [272, 288, 300]),
        (4096, [480, 496, 512]),
    ],
)
def test_default_capture_sizes_end_at_an_off_stride_token_limit(limit, tail):
    """The largest batch the config allows (up to 512) has a graph, as in vLLM: 257 tokens -> ..., 256,
    257."""
    sizes = CompilationConfig(max_num_batched_tokens=limit).cudagraph_capture_sizes
    assert sizes[-3:] == tail
    assert sizes == sorted(set(sizes))


def test_empty_capture_sizes_are_fine_without_graphs():
    assert CompilationConfig(cudagraph_capture_sizes=[], cudagraph_mode="NONE").cudagraph_capture_sizes == []


def test_compile_sizes_shorthand_expands_to_the_capture_sizes():
    config = CompilationConfig(compile_sizes=["cudagraph_capture_sizes"], cudagraph_capture_sizes=[8, 1, 4])
    assert config.compile_sizes == [1, 4, 8]
    mixed = CompilationConfig(compile_sizes=[3, "cudagraph_capture_sizes"], max_num_batched_tokens=100)
    assert (
        mixed.compile_sizes == sorted({3, *mixed.cudagraph_capture_sizes}) and mixed.compile_sizes[-1] == 100
    )
    assert config.compute_hash() == CompilationConfig(compile_sizes=[1, 4, 8]).compute_hash()


def test_inductor_config_keys_are_checked_at_construction():
    assert CompilationConfig(
        inductor_compile_config={
            "max_autotune": False,
            "triton.cudagraphs": False,
            "compile_threads": 1,
            "max_autotune_gemm_backends": "ATEN",
            "realize_opcount_threshold": 30,
        }
    )
    with pytest.raises(
        ConfigError, match=r"'triton\.cudagrafs' is not an Inductor config option.*triton\.cudagraphs"
    ):
        CompilationConfig(inductor_compile_config={"triton.cudagrafs": False})


def test_a_compiled_config_is_frozen_and_the_model_keeps_its_own_copy():
    """Editing a config after compile() raises instead of changing a compiled model half-way; in-place edits
    of its lists reach no model (the compiled model works from a copy)."""
    config = CompilationConfig(splitting_ops=list(models.SPLITTING_OPS), compiler="eager")
    compiled = pieceworks.compile(models.SillyModel(), config)
    with pytest.raises(
        ConfigError, match=r"CompilationConfig\.compile_sizes: .*frozen.*dataclasses\.replace"
    ):
        config.compile_sizes = [4]
    with pytest.raises(ConfigError, match="frozen"):
        compiled.config.max_num_batched_tokens = 4
    config.splitting_ops.clear()  # an in-place edit of the caller's config, before the first call
    assert compiled.config.splitting_ops == models.SPLITTING_OPS
    x = torch.randn(5)
    torch.testing.assert_close(compiled(x), models.silly_model_expected(x))
    assert len(compiled.runtime.compiled.pieces) == 5  # split as configured at compile(), not as edited later
    again = dataclasses.replace(config, splitting_ops=["silly::attention"], compile_sizes=[4])
    assert again.compile_sizes == [4]
    again.max_num_batched_tokens = 4096  # a new config is not frozen until it is compiled


def test_mode_accepts_names_and_has_vllm_values():
    assert CompilationConfig(cudagraph_mode="full").cudagraph_mode is CUDAGraphMode.FULL
    assert [m.value for m in CUDAGraphMode] == [0, 1, 2, 3, 4]
    M = CUDAGraphMode  # vLLM's pairs (mode of uniform decode batches, mode of mixed ones)
    assert {m: (m.decode_mode, m.mixed_mode) for m in M} == {
        M.NONE: (M.NONE, M.NONE),
        M.PIECEWISE: (M.PIECEWISE, M.PIECEWISE),
        M.FULL: (M.FULL, M.FULL),
        M.FULL_DECODE_ONLY: (M.FULL, M.NONE),
        M.FULL_AND_PIECEWISE: (M.FULL, M.PIECEWISE),
    }


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
    unchanged = [
        {"cache_dir": str(tmp_path)},
        {"cudagraph_mode": "NONE"},
        {"cache_enabled": False},
        {"cudagraph_capture_sizes": [1, 2]},
    ]
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


BOOLEANS = {
    "1": True,
    "true": True,
    "TRUE": True,
    " yes ": True,
    "On": True,
    "0": False,
    "false": False,
    "No": False,
    "off": False,
    "": False,
}


@pytest.mark.parametrize("value", list(BOOLEANS))
def test_the_disable_switch_takes_the_usual_spellings(value, monkeypatch):
    monkeypatch.setenv("PIECEWORKS_DISABLE_CACHE", value)
    assert CompilationConfig().cache_active() is not BOOLEANS[value]


@pytest.mark.parametrize("variable", ["PIECEWORKS_DISABLE_CACHE", "PIECEWORKS_PROGRESS"])
def test_a_boolean_variable_of_another_spelling_is_a_config_error_naming_it(variable, monkeypatch):
    monkeypatch.setenv(variable, "maybe")
    with pytest.raises(
        ConfigError, match=rf"\${variable}='maybe' is not a boolean\. Fix: set it to 1, true, yes or "
    ):
        CompilationConfig().cache_active() if variable == "PIECEWORKS_DISABLE_CACHE" else progress([1], "x")


def test_a_cache_folder_with_a_tilde_is_under_the_home_folder(monkeypatch, tmp_path):
    """Shells expand `~` only at the start of an unquoted word: `PIECEWORKS_CACHE_DIR='~/x'` reaches us as
    is."""
    monkeypatch.setenv("HOME", str(tmp_path))
    assert CompilationConfig(cache_dir="~/given").resolved_cache_dir() == str(tmp_path / "given")
    monkeypatch.setenv("PIECEWORKS_CACHE_DIR", "~/from-env")
    assert CompilationConfig().resolved_cache_dir() == str(tmp_path / "from-env")
    monkeypatch.delenv("PIECEWORKS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", "~/xdg")
    assert CompilationConfig().resolved_cache_dir() == str(tmp_path / "xdg" / "pieceworks")


def test_public_names():
    for name in ["CompilationConfig", "CUDAGraphMode", "compile", "Backend", "split_graph", "counters"]:
        assert hasattr(pieceworks, name), name
