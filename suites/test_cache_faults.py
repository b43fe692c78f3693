"""A broken cache location or a tampered index never kills a model nor loads the wrong code.

Unusable locations are real: a regular file as `cache_dir`, a path below a regular file, a folder under /proc
(procfs refuses to create it, even for root). A read-only cache is simulated: tests run as root here, and root
writes through permission bits, so `_writes_fail_under(root)` makes every write-mode open, create, rename and
delete below `root` fail with EROFS, the way a read-only mount would; the tree is then compared byte for byte
before and after, so a write that slipped past the simulation would fail the test too.
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import io
import json
import logging
import os
import pathlib
import shutil
import sys
import tempfile
import time

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import pieceworks
from pieceworks import CompilationConfig, CUDAGraphMode, counters
from pieceworks.cache import CLAIM_FIELDS, CompileCache, parse_index, serialize_index
from pieceworks.harness.models import toy as models

inductor = pytest.mark.inductor


def _compile_silly(cache_dir):
    torch._dynamo.reset()
    config = CompilationConfig(
        splitting_ops=["silly::attention"], cache_dir=str(cache_dir), cudagraph_mode=CUDAGraphMode.NONE
    )
    compiled = pieceworks.compile(models.SillyModel(), config)
    x = torch.randn(5, generator=torch.Generator().manual_seed(5))
    torch.testing.assert_close(compiled(x), models.silly_model_expected(x))
    return compiled


def _key_dir(root):
    (key,) = [d for d in os.listdir(root) if d != "inductor" and not d.startswith("model-")]
    return os.path.join(root, key)


def _tree(root):
    """Every path below `root` with its bytes (None for folders)."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for d in dirs:
            found[os.path.relpath(os.path.join(folder, d), root)] = None
        for f in files:
            path = os.path.join(folder, f)
            found[os.path.relpath(path, root)] = open(path, "rb").read()
    return found


@contextlib.contextmanager
def _writes_fail_under(root, error=errno.EROFS):
    """Every write below `root` fails with `error` (EROFS: see the module docstring): opens for writing,
    creates, renames, deletes. Reads, and shared locks on read-only descriptors, work."""
    root = os.path.abspath(root) + os.sep

    def under(path):
        return isinstance(path, (str, bytes, os.PathLike)) and os.path.abspath(os.fsdecode(path)).startswith(
            root
        )

    def refuse(path):
        raise OSError(error, f"{os.strerror(error)} (simulated)", os.fsdecode(path))

    real_open, real_os_open = builtins.open, os.open
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND

    def fake_open(file, mode="r", *args, **kwargs):
        if under(file) and any(c in mode for c in "wax+"):
            refuse(file)
        return real_open(file, mode, *args, **kwargs)

    def fake_os_open(path, flags, *args, **kwargs):
        if under(path) and flags & write_flags:
            refuse(path)
        return real_os_open(path, flags, *args, **kwargs)

    def guard(real, *paths_at):
        def call(*args, **kwargs):
            for i in paths_at:
                if i < len(args) and under(args[i]):
                    refuse(args[i])
            return real(*args, **kwargs)

        return call

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(builtins, "open", fake_open)
        mp.setattr(io, "open", fake_open)  # `Path.open`'s
        mp.setattr(os, "open", fake_os_open)
        for name, at in [
            ("mkdir", (0,)),
            ("replace", (0, 1)),
            ("rename", (0, 1)),
            ("unlink", (0,)),
            ("remove", (0,)),
            ("rmdir", (0,)),
        ]:
            mp.setattr(os, name, guard(getattr(os, name), *at))
        mp.setattr(shutil, "rmtree", guard(shutil.rmtree, 0))
        yield


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A cache holding SillyModel's three entries, compiled once for the module; tests work on copies."""
    root = tmp_path_factory.mktemp("pristine")
    with torch.no_grad():
        _compile_silly(root)
    torch._dynamo.reset()
    return root


def _copy(pristine, tmp_path):
    shutil.copytree(pristine, tmp_path / "cache")
    return tmp_path / "cache"


# ---- unusable locations: one warning, run uncached ---------------------------------------------------------
def _unusable(tmp_path, kind):
    if kind == "regular_file":
        path = tmp_path / "cache"
        path.write_bytes(b"a user's file")
        return path
    if kind == "below_a_file":
        (tmp_path / "file").write_bytes(b"a user's file")
        return tmp_path / "file" / "cache"
    if not os.path.isdir("/proc/self"):
        pytest.skip("needs Linux procfs for a folder that no one, root included, can create")
    return "/proc/pieceworks-cache"


@inductor
@pytest.mark.parametrize("kind", ["regular_file", "below_a_file", "procfs"])
def test_unusable_cache_directory_warns_once_and_runs_uncached(tmp_path, caplog, kind):
    path = _unusable(tmp_path, kind)
    before = _tree(tmp_path)
    caplog.set_level("WARNING", logger="pieceworks")
    with counters.expect(
        num_inductor_compiles=3, num_compiled_artifacts_saved=0, num_compiled_artifacts_loaded=0
    ):
        compiled = _compile_silly(path)
    assert compiled.runtime.compiled.cache_dir is None
    warnings = [r.getMessage() for r in caplog.records if "unusable" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    assert str(path) in warnings[0] and "PIECEWORKS_DISABLE_CACHE" in warnings[0]
    said = {
        "regular_file": f"({path} is a file, not a folder)",
        "below_a_file": f"({tmp_path / 'file'} is a file, not a folder)",
        "procfs": "(no such file or directory)",
    }[kind]
    assert said in warnings[0], warnings[0]
    assert _tree(tmp_path) == before  # the user's file is untouched
    caplog.clear()
    _compile_silly(path)  # once per location and process
    assert "unusable" not in caplog.text


@inductor
def test_a_cache_path_holding_a_space_compiles_and_warm_starts(tmp_path, monkeypatch):
    """Inductor's C++ build splits its command at spaces, so its kernels go to its own default folder then
    (here under a temporary folder of the test's); the pieceworks cache in the folder with a space still
    serves a warm start."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # the suite's folder: pieceworks ignores it
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where Inductor's default folder is
    torch.manual_seed(0)
    model = models.ToyLlama(models.ToyLlamaConfig(num_layers=1, hidden_size=24, mlp_size=40))
    config = CompilationConfig(
        splitting_ops=models.SPLITTING_OPS, cudagraph_mode="NONE", cache_dir=str(tmp_path / "my cache")
    )
    args = models.toy_llama_inputs(3, model.config)
    with torch.no_grad():
        with counters.expect(num_compiled_artifacts_loaded=0):
            torch.testing.assert_close(pieceworks.compile(model, config)(*args), model(*args))
        torch._dynamo.reset()
        with counters.expect(num_inductor_compiles=0):
            torch.testing.assert_close(pieceworks.compile(model, config)(*args), model(*args))


@inductor
def test_a_cache_on_a_full_disk_warns_once_and_runs_uncached(tmp_path, caplog, monkeypatch):
    """On a full disk a cache folder still opens (an empty file fits), but Inductor's writes of its kernels'
    sources into `<cache>/inductor` fail: one WARNING naming the reason, and every piece compiles in memory
    and runs, saved nowhere."""
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # the suite's folder: Inductor's would win
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))  # where Inductor's default folder is
    root = tmp_path / "cache"
    caplog.set_level("WARNING", logger="pieceworks")
    with _writes_fail_under(root / "inductor", errno.ENOSPC), counters.expect(num_compiled_artifacts_saved=0):
        _compile_silly(root)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "cannot be written (no space left on device" in warnings[0], warnings


# ---- read-only: load what is valid, compile the rest in memory, warn once ----------------------------------
@inductor
def test_read_only_cache_loads_what_is_valid_and_compiles_the_rest_in_memory(pristine, tmp_path, caplog):
    root = _copy(pristine, tmp_path)
    key_dir = _key_dir(root)
    index_path = os.path.join(key_dir, "index.json")
    entries = parse_index(open(index_path, "rb").read())
    dropped = sorted(entries)[0]
    del entries[dropped]
    open(index_path, "wb").write(serialize_index(entries))
    before = _tree(root)
    caplog.set_level("WARNING", logger="pieceworks")
    with _writes_fail_under(root):
        with counters.expect(
            num_compiled_artifacts_loaded=2,
            num_inductor_compiles=1,
            num_compiled_artifacts_saved=0,
            num_cache_artifacts_rejected=0,
        ):
            compiled = _compile_silly(root)
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert (
            len(warnings) == 1 and str(root) in warnings[0] and "PIECEWORKS_DISABLE_CACHE" in warnings[0]
        ), warnings
        assert "cannot be written" in warnings[0] and "read-only file system" in warnings[0]
        assert compiled.runtime.compiled.cache_dir == key_dir
        caplog.clear()
        with counters.expect(num_compiled_artifacts_loaded=2, num_inductor_compiles=1):
            _compile_silly(root)
        assert caplog.records == []  # warned once
    assert _tree(root) == before


# ---- wrong types inside the key directory: corrupt, reported, replaced, recompiled -------------------------
def _break(key_dir, what):
    path = os.path.join(key_dir, what)
    if what in ("artifacts", "locks"):
        shutil.rmtree(path)
        open(path, "wb").write(b"not a folder")
    else:
        os.unlink(path)
        os.mkdir(path)
        open(os.path.join(path, "inside"), "wb").write(b"x")
    return path


@inductor
@pytest.mark.parametrize(
    "what, recompiled", [("index.json", 3), ("index.lock", 0), ("artifacts", 3), ("locks", 0)]
)
def test_wrong_type_inside_the_key_directory_is_replaced(pristine, tmp_path, caplog, what, recompiled):
    root = _copy(pristine, tmp_path)
    path = _break(_key_dir(root), what)
    caplog.set_level("WARNING", logger="pieceworks")
    with counters.expect(
        num_inductor_compiles=recompiled,
        num_compiled_artifacts_loaded=3 - recompiled,
        num_compiled_artifacts_saved=recompiled,
    ):
        _compile_silly(root)
    assert path in caplog.text and "corrupt" in caplog.text
    assert os.path.isdir(path) == (what in ("artifacts", "locks"))
    with counters.expect(num_inductor_compiles=0, num_compiled_artifacts_loaded=3):
        _compile_silly(root)


# ---- index entries swapped under a valid digest ------------------------------------------------------------
@inductor
@pytest.mark.parametrize("swap", ["whole_entries", "files_only"])
def test_swapped_index_entries_are_corrupt_not_a_crash(pristine, tmp_path, caplog, swap):
    root = _copy(pristine, tmp_path)
    index_path = os.path.join(_key_dir(root), "index.json")
    entries = parse_index(open(index_path, "rb").read())
    a, b = sorted(entries)[:2]
    if swap == "whole_entries":
        entries[a], entries[b] = entries[b], entries[a]
    else:
        fields = ("file", "sha256", "bytes")
        moved = {k: entries[a][k] for k in fields}
        entries[a].update({k: entries[b][k] for k in fields})
        entries[b].update(moved)
    open(index_path, "wb").write(serialize_index(entries))
    caplog.set_level("WARNING", logger="pieceworks")
    with counters.expect(
        num_cache_artifacts_rejected=2, num_compiled_artifacts_loaded=1, num_inductor_compiles=2
    ):
        _compile_silly(root)
    assert ("another piece" if swap == "whole_entries" else "swapped") in caplog.text
    with counters.expect(
        num_cache_artifacts_rejected=0, num_compiled_artifacts_loaded=3, num_inductor_compiles=0
    ):
        _compile_silly(root)


def _claim(i):
    return {"graph": f"{i:064x}", "target": "range:1-8192", "inputs": f"inputs-{i % 2}"}


@given(n=st.integers(2, 6), data=st.data())
def test_entries_moved_between_names_never_load_for_the_wrong_piece(n, data, tmp_path_factory):
    """Store n entries, then rewrite the index (valid digest) with entries moved between names, whole or only
    their file fields: each name loads its own payload or nothing, never another's."""
    cache = CompileCache(str(tmp_path_factory.mktemp("moved")), "key")
    names = [f"range:1-8192|{_claim(i)['graph']}" for i in range(n)]
    for i, name in enumerate(names):
        assert cache.store(name, lambda p, i=i: open(p, "wb").write(b"payload %d" % i), _claim(i))
    entries = cache.read_index()
    order = data.draw(st.permutations(range(n)), label="order")
    whole = data.draw(st.booleans(), label="whole entries")
    moved = {}
    for i, j in enumerate(order):
        if whole:
            moved[names[i]] = dict(entries[names[j]])
        else:
            moved[names[i]] = {
                **entries[names[i]],
                **{k: entries[names[j]][k] for k in ("file", "sha256", "bytes")},
            }
    open(cache.index_path, "wb").write(serialize_index(moved))
    for i, name in enumerate(names):
        got = cache.load(name, lambda p: open(p, "rb").read(), _claim(i))[0]
        assert got in (None, b"payload %d" % i), f"{name} loaded {got!r}"
        if order[i] == i:
            assert got == b"payload %d" % i


def test_index_entries_carry_their_claim(tmp_path):
    cache = CompileCache(str(tmp_path), "key")
    assert cache.store("range:1-8|g", lambda p: open(p, "wb").write(b"x"), _claim(1))
    entry = cache.read_index()["range:1-8|g"]
    assert {k: entry[k] for k in CLAIM_FIELDS} == _claim(1)
    assert cache.load("range:1-8|g", lambda p: open(p, "rb").read(), _claim(1))[0] == b"x"
    assert cache.load("range:1-8|g", lambda p: open(p, "rb").read(), _claim(2))[0] is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="POSIX cache; tested on Linux")
def test_stale_temporaries_of_dead_writers_are_cleaned(tmp_path):
    cache = CompileCache(str(tmp_path), "key")
    stale = os.path.join(cache.artifact_dir, ".tmp-dead")
    fresh = os.path.join(cache.artifact_dir, ".tmp-live")
    for path in (stale, fresh):
        open(path, "wb").write(b"half")
    os.utime(stale, (0, 0))
    CompileCache(str(tmp_path), "key")
    assert not os.path.exists(stale) and os.path.exists(fresh)


def test_prune_removes_key_folders_unused_for_days_or_of_another_build(tmp_path):
    from pieceworks.cache import prune
    from pieceworks.key import software_factors

    def key_folder(name, environment, days_ago):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "factors.json").write_text(json.dumps({"environment": environment}))
        os.utime(folder, (time.time() - days_ago * 86400,) * 2)
        return str(folder)

    here = software_factors()
    recent, old = key_folder("recent", here, 1), key_folder("old", here, 40)
    other = key_folder("other", {**here, "torch": "0.0.0"}, 1)
    (tmp_path / "inductor").mkdir()
    for name, text in (("a-list", "[1]"), ("not-json", "{"), ("a-number", "3")):  # not key folders: kept
        (pathlib.Path(key_folder(name, here, 40)) / "factors.json").write_text(text)
        os.utime(tmp_path / name, (0, 0))
    assert prune(str(tmp_path), older_than_days=30) == [old]
    for name in ("a-list", "not-json", "a-number"):
        shutil.rmtree(tmp_path / name)
    with pytest.raises(TypeError, match="software_factors"):  # the old string form would remove every folder
        prune(str(tmp_path), environment=";".join(f"{k}={v}" for k, v in sorted(here.items())))
    assert prune(str(tmp_path), environment=here) == [other]
    assert sorted(os.listdir(tmp_path)) == ["inductor", "recent"] and os.path.isdir(recent)


@inductor
def test_a_cache_in_use_is_recent_for_prune(tmp_path):
    from pieceworks.cache import prune

    _compile_silly(tmp_path)
    key_dir = _key_dir(tmp_path)
    os.utime(key_dir, (time.time() - 40 * 86400,) * 2)
    _compile_silly(tmp_path)  # a warm start uses the folder
    assert prune(str(tmp_path), older_than_days=30) == [] and os.path.isdir(key_dir)
