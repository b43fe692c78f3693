"""The compile cache: warm starts in new processes, corruption, concurrent writers, keys, the index format."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import pieceworks
from pieceworks import CompilationConfig, counters
from pieceworks.cache import CacheIndexError, CompileCache, parse_index, serialize_index
from pieceworks.harness import models
from pieceworks.harness.scenario import run_scenario

pytestmark = pytest.mark.inductor


def _artifacts(cache_dir):
    (key_dir,) = [os.path.join(cache_dir, d) for d in os.listdir(cache_dir)]
    index = parse_index(open(os.path.join(key_dir, "index.json"), "rb").read())
    return key_dir, index


def _compile_silly(cache_dir, **kwargs):
    torch._dynamo.reset()
    config = CompilationConfig(splitting_ops=models.SPLITTING_OPS, cache_dir=str(cache_dir), **kwargs)
    compiled = pieceworks.compile(models.SillyModel(), config)
    x = torch.randn(5)
    torch.testing.assert_close(compiled(x), models.silly_model_expected(x))
    return compiled


def test_warm_start_in_a_new_process_compiles_nothing(tmp_path):
    args = ["--model", "toy_llama", "--layers", "2", "--cache-dir", str(tmp_path), "--batches", "1,5,70"]
    cold = run_scenario(*args)
    warm = run_scenario(*args)
    assert cold["counters"]["num_inductor_compiles"] == 3  # first, middle and last piece, one range
    assert cold["counters"]["num_compiled_artifacts_saved"] == 3
    assert warm["counters"]["num_inductor_compiles"] == 0
    assert warm["counters"]["num_compiled_artifacts_loaded"] == 3
    assert warm["cache_dir"] == cold["cache_dir"]
    assert cold["max_rel_error"] < 1e-5 and warm["max_rel_error"] < 1e-5


def test_identical_pieces_are_loaded_once(tmp_path):
    args = ["--model", "toy_llama", "--layers", "6", "--cache-dir", str(tmp_path), "--batches", "3"]
    run_scenario(*args)
    warm = run_scenario(*args)["counters"]
    assert warm["num_compiled_artifacts_loaded"] == 3 and warm["num_shared_piece_compiles"] == 7 - 3


def _torch_key() -> bytes:
    from torch._inductor.codecache import torch_key  # only to forge an artifact of "another build"

    return torch_key()


def _corrupt(path, how):
    data = open(path, "rb").read()
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "garbage":
        data = os.urandom(len(data))
    elif how == "empty":
        data = b""
    elif how == "flipped":
        data = data[:100] + bytes([data[100] ^ 0xFF]) + data[101:]
    elif how == "other_build":
        key = _torch_key()
        assert key in data
        data = data.replace(key, bytes(b ^ 0x5A for b in key))
    open(path, "wb").write(data)
    return data


@pytest.mark.parametrize("how", ["truncated", "garbage", "empty", "flipped", "other_build"])
def test_corrupt_artifact_is_reported_and_recompiled(tmp_path, caplog, how):
    _compile_silly(tmp_path)
    key_dir, index = _artifacts(tmp_path)
    name, entry = sorted(index.items())[0]
    path = os.path.join(key_dir, "artifacts", entry["file"])
    data = _corrupt(path, how)
    if how == "other_build":  # consistent index, so that only the loader can object
        import hashlib

        index[name] = {**entry, "sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
        open(os.path.join(key_dir, "index.json"), "wb").write(serialize_index(index))
    caplog.set_level("WARNING", logger="pieceworks")
    with counters.expect(num_cache_artifacts_rejected=1, num_inductor_compiles=1, num_compiled_artifacts_loaded=2,
                         num_compiled_artifacts_saved=1):
        _compile_silly(tmp_path)
    assert path in caplog.text and "recompiling" in caplog.text
    with counters.expect(num_cache_artifacts_rejected=0, num_inductor_compiles=0, num_compiled_artifacts_loaded=3):
        _compile_silly(tmp_path)


def test_unreadable_index_is_logged_and_rebuilt(tmp_path, caplog):
    _compile_silly(tmp_path)
    key_dir, _ = _artifacts(tmp_path)
    open(os.path.join(key_dir, "index.json"), "wb").write(b"{not json")
    caplog.set_level("WARNING", logger="pieceworks")
    with counters.expect(num_inductor_compiles=3, num_compiled_artifacts_loaded=0):
        _compile_silly(tmp_path)
    assert "index.json is unreadable" in caplog.text
    assert len(_artifacts(tmp_path)[1]) == 3


def test_disabled_cache_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PIECEWORKS_DISABLE_CACHE", "1")
    with counters.expect(num_compiled_artifacts_saved=0, num_inductor_compiles=3):
        compiled = _compile_silly(tmp_path)
    assert compiled.runtime.cache_dir is None
    assert os.listdir(tmp_path) == []
    monkeypatch.delenv("PIECEWORKS_DISABLE_CACHE")
    with counters.expect(num_compiled_artifacts_saved=0, num_inductor_compiles=3):
        _compile_silly(tmp_path, cache_enabled=False)


def test_cache_key_changes_with_config_not_with_path(tmp_path):
    a = _compile_silly(tmp_path / "a").runtime.cache_dir
    b = _compile_silly(tmp_path / "b").runtime.cache_dir
    c = _compile_silly(tmp_path / "a", compile_ranges=[8]).runtime.cache_dir
    assert os.path.basename(a) == os.path.basename(b)
    assert os.path.basename(a) != os.path.basename(c)
    factors = json.load(open(os.path.join(a, "factors.json")))
    assert set(factors) == {"environment", "config", "graph"}
    assert str(tmp_path) not in json.dumps(factors)


CONCURRENT_WRITER = """
import sys, torch, pieceworks
from pieceworks.harness import models
config = pieceworks.CompilationConfig(splitting_ops=models.SPLITTING_OPS, cache_dir=sys.argv[1])
out = pieceworks.compile(models.SillyModel(), config)(torch.zeros(4))
assert torch.equal(out, torch.full((4,), 19.0)), out
print(pieceworks.counters.num_inductor_compiles, pieceworks.counters.num_compiled_artifacts_loaded)
"""


@pytest.mark.slow
def test_concurrent_writers_leave_a_consistent_cache(tmp_path):
    procs = [
        subprocess.Popen([sys.executable, "-c", CONCURRENT_WRITER, str(tmp_path)], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-3000:]
    key_dir, index = _artifacts(tmp_path)
    assert len(index) == 3
    import hashlib

    for entry in index.values():
        data = open(os.path.join(key_dir, "artifacts", entry["file"]), "rb").read()
        assert hashlib.sha256(data).hexdigest() == entry["sha256"]
    leftovers = [f for f in os.listdir(os.path.join(key_dir, "artifacts")) if f.startswith(".tmp")]
    assert leftovers == []
    with counters.expect(num_inductor_compiles=0, num_compiled_artifacts_loaded=3, num_cache_artifacts_rejected=0):
        _compile_silly(tmp_path)


def test_index_format_is_strict_json(tmp_path):
    entries = {"range:1-8|abc": {"file": "x.bin", "sha256": "0" * 64, "bytes": 3}}
    assert parse_index(serialize_index(entries)) == entries
    for bad in [b"", b"\xff\xfe", b"[]", b'{"version": 99, "entries": {}}',
                b'{"version": 1, "entries": {"k": {"file": "../x", "sha256": "", "bytes": 1}}}',
                b'{"version": 1, "entries": {"k": {"file": "x", "sha256": 1, "bytes": 1}}}',
                serialize_index(entries).replace(b'"bytes": 3', b'"bytes": 4')]:
        with pytest.raises(CacheIndexError):
            parse_index(bad)


def test_unsaveable_artifact_is_logged_not_fatal(tmp_path, caplog):
    cache = CompileCache(str(tmp_path), "k")

    def fail(path):
        raise RuntimeError("nothing to save")

    caplog.set_level("WARNING", logger="pieceworks")
    assert cache.store("range:1-8|x", fail) is False
    assert "could not save" in caplog.text
    assert cache.read_index() == {}
    assert [f for f in os.listdir(cache.artifact_dir)] == []
