"""Atomicity and locking of the compile cache under faults (no compiler involved: artifacts are byte
payloads).

- A writer killed (SIGKILL) at any point of a store, or whose write raises half-way, leaves a cache in which
  every entry the index lists loads exactly the bytes stored under that name, every store that had returned is
  there, and a later writer stores the rest (its locks died with it).
- Several processes storing different entries into one key at once lose none of them and pair none with
  another process's file, while a reader that loads all the time sees only whole payloads.
- Whatever function writes the index: a write the kernel stops part-way (a file size limit) leaves the old
  index, and a reader that takes no lock only ever sees a whole index.

Writers are forked children of the test process (fast: no new interpreter), so the fault is injected by
patching the child's `os` functions; a forked child only does file I/O and leaves with `os._exit`.
"""

from __future__ import annotations

import os
import resource
import signal
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pieceworks.cache import CompileCache, parse_index

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (POSIX)")

KEY = "key"


def _name(writer: int, i: int) -> str:
    return f"range:1-8192|w{writer}-e{i}"


def _payload(name: str) -> bytes:
    return (name.encode() + b";") * (50 + len(name))  # a few KiB, unique per name


def _claim(name: str) -> dict[str, str]:
    return {"graph": name, "target": "range:1-8192", "inputs": "x"}


def _save(name: str):
    def save(path: str) -> None:
        with open(path, "wb") as f:
            f.write(_payload(name))

    return save


def _fork(body) -> int:
    """Run `body()` in a forked child that leaves with `os._exit` (0 if body returned, 3 if it raised)."""
    pid = os.fork()
    if pid == 0:  # child
        code = 3
        try:
            body()
            code = 0
        finally:
            os._exit(code)
    return pid


def _loads_exactly(cache: CompileCache, names) -> dict[str, bytes | None]:
    got = {}
    for name in names:
        got[name] = cache.load(name, lambda p: open(p, "rb").read(), _claim(name))[0]
        assert got[name] in (None, _payload(name)), f"{name} loaded {len(got[name])} bytes of something else"
    return got


# ---- a writer killed or failing at a chosen point ---------------------------------------------------------
FAULTS = [
    "kill_in_artifact_write",
    "kill_before_fsync",
    "kill_before_rename",
    "kill_in_index_write",
    "raise_in_artifact_write",
    "raise_in_index_write",
]


def _faulty_writer(root: str, names: list[str], fault: str, nth: int, done_w: int) -> None:
    """Child: store `names` in order, reporting each completed store on `done_w`; fail as `fault` says at the
    `nth` opportunity (a kill ends the process; a raise makes that store fail and the writer go on)."""
    count = {"n": 0}

    def due() -> bool:
        count["n"] += 1
        return count["n"] == nth

    def half_then(fail_how, data: bytes, f) -> None:
        f.write(data[: len(data) // 2])
        f.flush()
        if fail_how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise OSError(28, "No space left on device (injected)")

    how = fault.split("_")[0]
    real_fsync, real_replace, real_fdopen = os.fsync, os.replace, os.fdopen
    if fault == "kill_before_fsync":
        os.fsync = lambda fd: (due() and os.kill(os.getpid(), signal.SIGKILL)) or real_fsync(fd)
    elif fault == "kill_before_rename":
        os.replace = lambda a, b: (due() and os.kill(os.getpid(), signal.SIGKILL)) or real_replace(a, b)
    elif fault.endswith("index_write"):  # atomic_write writes the index through os.fdopen

        class Writer:
            def __init__(self, f):
                self.f = f

            def write(self, data):
                if due():
                    half_then(how, data, self.f)
                return self.f.write(data)

            def __getattr__(self, name):
                return getattr(self.f, name)

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return self.f.__exit__(*exc)

        os.fdopen = lambda *a, **k: Writer(real_fdopen(*a, **k))

    cache = CompileCache(root, KEY)
    for name in names:
        save = _save(name)
        if fault.endswith("artifact_write"):

            def save(path, name=name):
                with open(path, "wb") as f:
                    if due():
                        half_then(how, _payload(name), f)
                    f.write(_payload(name))

        if cache.store(name, save, _claim(name)):
            os.write(done_w, (name + "\n").encode())


@settings(max_examples=30)
@given(fault=st.sampled_from(FAULTS), nth=st.integers(1, 6), stored_before=st.integers(0, 2))
def test_a_writer_failing_anywhere_leaves_no_torn_file(fault, nth, stored_before, tmp_path_factory, caplog):
    root = str(tmp_path_factory.mktemp("faults"))
    earlier = [_name(0, i) for i in range(stored_before)]
    cache = CompileCache(root, KEY)
    for name in earlier:
        assert cache.store(name, _save(name), _claim(name))
    names = [_name(1, i) for i in range(3)]
    done_r, done_w = os.pipe()
    pid = _fork(lambda: _faulty_writer(root, names, fault, nth, done_w))
    os.close(done_w)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(done_r) as r:
        completed = r.read().split()
    if fault.startswith("kill"):
        assert os.WIFSIGNALED(status) or os.WEXITSTATUS(status) == 0, status
    else:
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    caplog.set_level("WARNING", logger="pieceworks")
    reader = CompileCache(root, KEY)
    index = reader.read_index()
    assert "unreadable" not in caplog.text  # never half an index
    assert set(index) <= set(earlier + names)
    got = _loads_exactly(reader, index)
    assert all(got[n] == _payload(n) for n in earlier + completed), (
        "a store that had returned is missing or torn"
    )
    for name in names:  # the dead writer's locks are gone: a new writer completes the job
        if name not in index:
            assert reader.store(name, _save(name), _claim(name))
    assert _loads_exactly(reader, earlier + names) == {n: _payload(n) for n in earlier + names}
    owned = {e["file"] for e in reader.read_index().values()}
    assert {f for f in os.listdir(reader.artifact_dir) if not f.startswith(".tmp-")} == owned, (
        "orphan artifacts"
    )


def test_a_store_whose_save_raises_changes_nothing(tmp_path):
    cache = CompileCache(str(tmp_path), KEY)
    assert cache.store(_name(0, 0), _save(_name(0, 0)), _claim(_name(0, 0)))
    before = open(cache.index_path, "rb").read()

    def save(path):
        with open(path, "wb") as f:
            f.write(b"half")
        raise RuntimeError("serialisation failed half-way")

    assert cache.store(_name(0, 1), save, _claim(_name(0, 1))) is False
    assert open(cache.index_path, "rb").read() == before
    assert [f for f in os.listdir(cache.artifact_dir) if f.startswith(".tmp")] == []


# ---- many writers, different entries, one key -------------------------------------------------------------
def test_concurrent_writers_of_different_entries_lose_nothing(tmp_path, caplog):
    root = str(tmp_path)
    CompileCache(root, KEY)
    writers, per_writer = 4, 12
    go_r, go_w = os.pipe()

    def writer(w: int) -> None:
        os.close(go_w)
        os.read(go_r, 1)  # all start together
        cache = CompileCache(root, KEY)
        for i in range(per_writer):
            name = _name(w, i)
            assert cache.store(name, _save(name), _claim(name))

    pids = [_fork(lambda w=w: writer(w)) for w in range(writers)]
    os.close(go_r)
    os.write(go_w, b"x" * writers)
    os.close(go_w)
    caplog.set_level("WARNING", logger="pieceworks")
    reader = CompileCache(root, KEY)
    names = [_name(w, i) for w in range(writers) for i in range(per_writer)]
    running = set(pids)
    deadline = time.monotonic() + 120
    while running and time.monotonic() < deadline:  # read while they write: whole payloads or misses only
        _loads_exactly(reader, names[::5])
        for pid in list(running):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                running.discard(pid)
                assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, f"writer failed: {status}"
    assert not running, "writers did not finish in 120 s"
    assert "unreadable" not in caplog.text
    index = reader.read_index()
    missing = sorted(set(names) - set(index))
    assert not missing, (
        f"{len(missing)} of {len(names)} entries lost by concurrent writers, e.g. {missing[:3]}"
    )
    assert _loads_exactly(reader, names) == {n: _payload(n) for n in names}


# ---- a write stopped by the kernel, a reader without the lock ----------------------------------------------
def _store_with_file_size_limit(root: str, names: list[str], limit: int) -> None:
    """Child: store `names` while the kernel refuses to grow any file past `limit` bytes (RLIMIT_FSIZE: the
    write fails part-way, or SIGXFSZ ends the process), whichever call writes."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
    cache = CompileCache(root, KEY)
    for name in names:
        cache.store(name, _save(name), _claim(name))


def _filled(root: str, entries: int) -> tuple[CompileCache, list[str]]:
    cache = CompileCache(root, KEY)
    names = [_name(0, i) for i in range(entries)]
    for name in names:
        assert cache.store(name, _save(name), _claim(name))
    return cache, names


@pytest.mark.parametrize("cut", [0.0, 0.3, 0.7, 0.99])
def test_a_writer_stopped_in_any_write_leaves_every_file_old_or_new(cut, tmp_path, caplog):
    """The writer's index write is stopped by the kernel at a fraction `cut` of the index it replaces,
    whatever function writes it: the index must still be the old one (every entry loads its bytes), never a
    torn file."""
    cache, earlier = _filled(str(tmp_path), 40)
    old_size = len(Path(cache.index_path).read_bytes())
    artifact = max(len(_payload(_name(1, i))) for i in range(3))
    limit = artifact + 1 + int(cut * (old_size - artifact))  # artifacts fit; the index write (bigger) cannot
    pid = _fork(lambda: _store_with_file_size_limit(str(tmp_path), [_name(1, i) for i in range(3)], limit))
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) or os.WEXITSTATUS(status) == 0, status
    caplog.set_level("WARNING", logger="pieceworks")
    reader = CompileCache(str(tmp_path), KEY)
    assert set(reader.read_index()) == set(earlier), "the index is neither the old one nor a new one"
    assert "unreadable" not in caplog.text
    assert _loads_exactly(reader, earlier) == {n: _payload(n) for n in earlier}


def test_a_reader_without_the_lock_sees_the_old_index_or_the_new(tmp_path):
    """Tools read index.json without taking its lock (a `cat`, a backup): while a writer rewrites it a hundred
    times, every read is a whole index."""
    cache, _ = _filled(str(tmp_path), 100)
    pid = _fork(lambda: _filled(str(tmp_path), 200))  # the first 100 again (same bytes), then 100 more
    torn, reads, path = [], 0, Path(cache.index_path)
    while not os.waitpid(pid, os.WNOHANG)[0]:
        data = path.read_bytes()
        reads += 1
        if not data.rstrip().endswith(b"}"):  # cheap, so that reads are many; a whole index ends with "}"
            torn.append(len(data))
    assert not torn, f"{len(torn)} of {reads} reads saw a torn index (sizes {torn[:5]})"
    assert len(parse_index(path.read_bytes())) == 200
