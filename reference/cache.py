"""The on-disk compile cache.

Layout: `<root>/<key>/` where `key` digests everything that changes compiled code (the traced graph with its
input metadata, the config hash, the effective Inductor configuration, the torch/Triton/Python build and the
GPU) and nothing that varies per run. Inside: `index.json` maps an entry name (`range:1-8192|<piece
fingerprint>` or `size:4|<piece fingerprint>`) to an artifact file, its SHA-256 and size, and the claim of the
piece it was compiled for; `artifacts/` holds the files; `locks/` one lock file per entry; `factors.json`
records the key's inputs for people. `<root>/inductor/` is Inductor's own cache while pieceworks compiles and
loads (see `CompileCache.inductor_dir`), so that copying `<root>` to another machine carries the built kernels
too.

Contracts:
- every file is written to a temporary name in the same folder, fsynced and renamed: a reader sees the old
  file or the new one, never half of one;
- writers take an exclusive `flock` on `index.lock` to install an artifact and merge the index (read, update,
  write), so concurrent processes never lose each other's entries or pair an index hash with another file;
  readers take a shared lock while they check and load;
- `entry_lock(name)`: processes that miss the same entry take turns on that entry's lock, so one compiles and
  stores it while the others wait and then load it (N cold processes cost about one cold compile);
- the index is JSON, read with `json.loads` (no eval, no pickle), with a SHA-256 over its entries; an index
  that does not parse or does not match its digest is logged and treated as empty;
- an entry is loaded only if it names the file derived from its own name and claims the same piece (graph
  fingerprint, compile target, input metadata) as the caller; an artifact whose bytes do not match the index's
  SHA-256 (truncated, garbled, overwritten) is never loaded. Either is logged with its path and the caller
  recompiles. An artifact that fails to load (another torch build) likewise;
- a broken location never kills a model: a directory that cannot be created or written at all gives one
  WARNING (path, reason, `PIECEWORKS_DISABLE_CACHE`) and `CompileCache.open` returns None (run uncached); a
  read-only cache loads what is valid and compiles the rest in memory (one WARNING); a file where the cache
  expects a folder, or a folder where it expects a file, inside the key directory is logged as corrupt and
  replaced. Each problem of a cache root (all its key folders) warns once per process, in words;
- `prune(root, older_than_days=..., environment=...)` removes key folders unused for N days or built by
  another torch build, GPU or Python (a key folder's mtime is its last use).
POSIX only (`fcntl`). Safe across processes; one `CompileCache` object is not meant to be shared by threads.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

from ._compat import inductor_default_cache_dir
from .counters import counters, log

Entry = dict[str, Any]  # an index entry: its file's name, SHA-256 and size, and the claim of its piece
Claim = dict[str, str]  # what an entry says about its piece (CLAIM_FIELDS)
INDEX_VERSION = 1
# What an entry says about the piece it was compiled for; a load for another piece is refused.
CLAIM_FIELDS = ("graph", "target", "inputs")
_REQUIRED: dict[str, type] = {"file": str, "sha256": str, "bytes": int}  # every entry's fields, by type
_FIELDS = _REQUIRED | dict.fromkeys(CLAIM_FIELDS, str)  # the fields an entry may have
_PLAIN_NAME = re.compile(r"[^./][^/]*")  # a file in `artifacts/`: no folder, not hidden
_warned: set[tuple[str, str | None]] = set()  # (kind, location): one warning per broken location per process
# What each problem logs (`_warn`): `%s` the path (or entry), then why.
_WARNINGS = {
    "unusable": "pieceworks compile cache %s is unusable (%s); compiling without the cache. Fix: point "
    "CompilationConfig.cache_dir or PIECEWORKS_CACHE_DIR at a writable folder, or set "
    "PIECEWORKS_DISABLE_CACHE=1 to run uncached without this warning",
    "read-only": "pieceworks compile cache %s cannot be written (%s): loading the valid artifacts it holds "
    "and compiling the rest in memory, without saving them. Fix: make it writable or free space, point "
    "CompilationConfig.cache_dir or PIECEWORKS_CACHE_DIR elsewhere, or set PIECEWORKS_DISABLE_CACHE=1",
    "index": "pieceworks cache index %s is unreadable (%s); ignoring it and recompiling",
    "corrupt": "pieceworks cache: %s is %s (a corrupt cache); removing it, its entries will be recompiled",
    "unsaved": "pieceworks could not save the artifact for %s (%s); it will be recompiled next time",
    "rejected": "pieceworks cache artifact %s %s; not loading it, recompiling",
}


class CacheIndexError(ValueError):
    """The index file is not a pieceworks index of this version. The message says what is wrong."""


def artifact_stem(name: str) -> str:
    """How the artifact files of entry `name` begin (derived from the name, so entries cannot trade files).
    A file is `<stem>-<first 16 hex digits of its SHA-256>.bin`: a new version of an entry never overwrites
    the file the index still names, so a writer dying between installing a file and updating the index
    leaves the old entry intact."""
    return hashlib.sha256(name.encode()).hexdigest()[:32]


def entries_digest(entries: dict[str, Entry]) -> str:
    return hashlib.sha256(json.dumps(entries, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def serialize_index(entries: dict[str, Entry]) -> bytes:
    """The index file's bytes: JSON with the entries and a SHA-256 over them (so no edit goes unnoticed)."""
    doc = {"version": INDEX_VERSION, "entries": entries, "sha256": entries_digest(entries)}
    return json.dumps(doc, sort_keys=True, indent=1).encode()


def parse_index(data: bytes) -> dict[str, Entry]:
    """Parse index bytes; raise `CacheIndexError` naming the problem for anything but an intact index."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CacheIndexError(f"not JSON ({exc})") from None
    entries = doc.get("entries") if isinstance(doc, dict) and doc.get("version") == INDEX_VERSION else None
    if not isinstance(entries, dict):
        raise CacheIndexError(f"not a version-{INDEX_VERSION} pieceworks index")
    for name, entry in entries.items():  # known fields of the right types, a plain file name
        types = {k: type(v) for k, v in entry.items()} if isinstance(entry, dict) else {}
        typed = _REQUIRED.keys() <= types.keys() and types.items() <= _FIELDS.items()
        if not (typed and _PLAIN_NAME.fullmatch(entry["file"])):
            raise CacheIndexError(f"entry {name!r} is malformed: {entry!r}")
    if doc.get("sha256") != entries_digest(entries):
        raise CacheIndexError("its entries do not match its SHA-256 (edited or garbled)")
    return entries


def atomic_write(path: str, data: bytes) -> None:
    """Write `data` to `path` atomically: temporary file in the same folder, fsync, rename."""
    folder = os.path.dirname(path) or "."
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    with contextlib.suppress(OSError):  # the rename itself, durable (a folder that refuses fsync is closed)
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def file_sha256(path: str) -> tuple[str, int]:
    """The SHA-256 (hex) and the size in bytes of the file at `path`."""
    return hashlib.sha256(data := Path(path).read_bytes()).hexdigest(), len(data)


def _reason(exc: BaseException) -> str:
    """Why, in words: `"/c is a file, not a folder"`, `"permission denied"`; the type name for anything
    else."""
    path = getattr(exc, "filename", None)
    while path and not os.path.lexists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)  # the part of the path that stands in the way
    if isinstance(exc, (FileExistsError, NotADirectoryError)) and path and not os.path.isdir(path):
        return f"{path} is a file, not a folder"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[:1].lower() + exc.strerror[1:]
    return f"{type(exc).__name__}: {exc}"


def _warn(kind: str, what: str, why: BaseException | str, once_for: str | None = None) -> None:
    """Log `_WARNINGS[kind]` about `what` (a path or an entry) and `why` (an exception: in words); with
    `once_for` (a location), once per process for that location."""
    if (kind, once_for) not in _warned:
        if once_for is not None:
            _warned.add((kind, once_for))
        log.warning(_WARNINGS[kind], what, why if isinstance(why, str) else _reason(why))


def _remove(path: str | Path) -> None:
    shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)


def _entry_problem(name: str, entry: Entry, path: str, claim: Claim) -> str | None:
    """Why the artifact at `path` must not be loaded as entry `name` for a piece with `claim`, or None: the
    entry claims another piece, names another entry's file, or the file's bytes differ from the index's
    SHA-256. `OSError` if the file cannot be read."""
    if wrong := [f"{k}={entry.get(k)!r} (this piece: {v!r})" for k, v in claim.items() if entry.get(k) != v]:
        return f"was stored for another piece: {', '.join(wrong)}"
    if not entry["file"].startswith(artifact_stem(name) + "-"):
        return f"is not the file of entry {name!r} (swapped index entries)"
    sha, size = file_sha256(path)
    if (sha, size) != (entry["sha256"], entry["bytes"]):
        indexed = f"{entry['bytes']} bytes with {entry['sha256'][:12]}…"
        return f"has {size} bytes with SHA-256 {sha[:12]}…, the index says {indexed} (truncated or garbled)"
    return None


class CompileCache:
    """Artifacts of one (graph, config, environment) key under `root`.

    `CompileCache(root, key)` raises `OSError` when the key directory cannot be created; `CompileCache.open`
    turns that into one WARNING and None. `writable` is False for a cache that can be read but not written.
    """

    def __init__(self, root: str, key: str, factors: dict[str, Any] | None = None) -> None:
        self.root = os.path.abspath(root)
        self.directory = os.path.join(self.root, key)
        self.artifact_dir, self.lock_dir, self.index_path, self.lock_path, self.factors_path = (
            os.path.join(self.directory, n)
            for n in ("artifacts", "locks", "index.json", "index.lock", "factors.json")
        )
        self.writable = True
        self._make_folder(self.directory, "a file where the cache folder belongs")  # OSError: unusable
        try:  # a read-only cache raises here, at the probe
            tempfile.TemporaryFile(dir=self.directory, prefix=".tmp-probe-").close()
            for folder in (self.artifact_dir, self.lock_dir):
                self._make_folder(folder, "a file where a folder belongs")
            for path in (self.index_path, self.lock_path, self.factors_path):
                if os.path.isdir(path) and not os.path.islink(path):
                    self.replace_corrupt(path, "a folder where a file belongs")
            cutoff = time.time() - 3600.0  # temporary files older than an hour are dead writers' leftovers
            for tmp in [*Path(self.directory).glob(".tmp-*"), *Path(self.artifact_dir).glob(".tmp-*")]:
                with contextlib.suppress(OSError):
                    if tmp.lstat().st_mtime < cutoff:
                        _remove(tmp)
            os.utime(self.directory)  # the last use, which `prune` reads
            if factors and not os.path.exists(self.factors_path):
                atomic_write(self.factors_path, json.dumps(factors, sort_keys=True, indent=1).encode())
        except OSError as exc:
            self.mark_read_only(exc)

    @classmethod
    def open(cls, root: str, key: str, factors: dict[str, Any] | None = None) -> CompileCache | None:
        """The cache, or None (after one WARNING naming the path and the reason) if it cannot be used at
        all."""
        try:
            return cls(root, key, factors)
        except OSError as exc:
            _warn("unusable", os.path.join(os.path.abspath(root), key), exc, once_for=os.path.abspath(root))
            return None

    # ---- set-up -------------------------------------------------------------------------------------------
    def _make_folder(self, path: str, what: str) -> None:
        """Create the folder `path` if needed, replacing what stands in its place (`what`)."""
        if os.path.lexists(path) and not os.path.isdir(path):
            self.replace_corrupt(path, what)
        os.makedirs(path, exist_ok=True)

    def replace_corrupt(self, path: str, what: str) -> None:
        _warn("corrupt", path, what)
        _remove(path)

    def mark_read_only(self, exc: BaseException) -> None:
        self.writable = False
        _warn("read-only", self.root, exc, once_for=self.root)

    @property
    def inductor_dir(self) -> str | None:
        """Where Inductor's own cache lives while pieceworks compiles and loads: `<root>/inductor`, so that
        the pieceworks cache carries the kernels a warm start would otherwise rebuild (C++ libraries on
        CPU). None when the cache is read-only (Inductor must write), its path holds a space (Inductor's C++
        build splits its command at spaces; kernels then go to Inductor's default folder) or
        `TORCHINDUCTOR_CACHE_DIR` names a folder of the user's choosing (it wins, as in SGLang)."""
        # Inductor writes its default into the environment once it has used it: set is not chosen, another is
        default = os.path.abspath(inductor_default_cache_dir())
        chosen = os.path.abspath(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default)
        own = self.writable and " " not in self.root and chosen == default
        return os.path.join(self.root, "inductor") if own else None

    # ---- locks --------------------------------------------------------------------------------------------
    def index_lock(self, exclusive: bool) -> contextlib.AbstractContextManager[None]:
        """Hold the index's lock: exclusive to install an artifact and merge the index, shared to read it."""
        lock = _open_lock(self.lock_path)
        if lock is None and exclusive:
            raise PermissionError(f"cannot open the index lock {self.lock_path}")
        operation = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        return _flocked(lock, operation) if lock else contextlib.nullcontext()

    def entry_lock(self, name: str) -> contextlib.AbstractContextManager[None]:
        """Hold entry `name`'s exclusive lock across processes (while compiling and storing it), so that
        processes missing the same entry take turns: the first compiles and stores it, the others then find
        it. A no-op when the cache is read-only."""
        path = os.path.join(self.lock_dir, artifact_stem(name) + ".lock")
        lock = _open_lock(path) if self.writable else None
        return _flocked(lock, fcntl.LOCK_EX, waiting_for=name) if lock else contextlib.nullcontext()

    # ---- reading ------------------------------------------------------------------------------------------
    def read_index(self) -> dict[str, Entry]:
        """The index's entries; `{}` (logged) when the file is missing, cannot be read or is not an intact
        index."""
        try:
            return parse_index(Path(self.index_path).read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, CacheIndexError) as exc:
            _warn("index", self.index_path, exc, once_for=self.index_path)
            return {}

    def load(
        self, name: str, loader: Callable[[str], Any], claim: Claim | None = None, skip: Entry | None = None
    ) -> tuple[Any, Entry | None]:
        """`(loader(path), entry)` for entry `name`, or `(None, entry)`: a miss when the entry is absent,
        corrupt or unloadable, or equal to `skip` (an entry this caller already tried: not loaded nor reported
        twice). One read of the index, under its shared lock.

        `claim` (see CLAIM_FIELDS): what the caller's piece is; an entry claiming anything else is corrupt.
        """
        with self.index_lock(exclusive=False):
            entry = self.read_index().get(name)
            if entry is None or entry == skip:
                return None, entry
            path = os.path.join(self.artifact_dir, entry["file"])
            try:
                problem = _entry_problem(name, entry, path, claim or {})
                loaded = None if problem else loader(path)
            except Exception as exc:  # noqa: BLE001 - any failure to read or load means: recompile
                problem, loaded = f"failed to load ({type(exc).__name__}: {exc})", None
        if problem:
            counters.num_cache_artifacts_rejected += 1
            _warn("rejected", path, problem)
        return loaded, entry

    # ---- writing ------------------------------------------------------------------------------------------
    def store(self, name: str, save: Callable[[str], None], claim: Claim | None = None) -> bool:
        """Save an artifact with `save(tmp_path)` and record it as entry `name` with `claim`.

        False (logged) if `save` fails or the cache cannot be written; the caller runs what it compiled
        anyway.
        """
        if not self.writable:
            return False
        tmp = os.path.join(self.artifact_dir, f".tmp-{os.getpid()}-{time.monotonic_ns()}")  # `save` writes it
        try:
            save(tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            sha, size = file_sha256(tmp)
            stem = artifact_stem(name)
            file = f"{stem}-{sha[:16]}.bin"
            entry = {"file": file, "sha256": sha, "bytes": size, **(claim or {})}
            with self.index_lock(exclusive=True):
                os.replace(tmp, os.path.join(self.artifact_dir, file))
                atomic_write(self.index_path, serialize_index({**self.read_index(), name: entry}))
                _warned.discard(("index", self.index_path))  # intact again: a new break warns again
                # earlier versions of the entry, and its files of writers that died
                for old in [f for f in os.listdir(self.artifact_dir) if f.startswith(stem) and f != file]:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(self.artifact_dir, old))
        except Exception as exc:  # noqa: BLE001 - an unsaveable artifact still runs; it just is not cached
            with contextlib.suppress(OSError):
                _remove(tmp)
            if isinstance(exc, OSError):  # the cache cannot be written
                self.mark_read_only(exc)
            else:
                _warn("unsaved", name, exc)
            return False
        return True


def read_json_dict(path: str) -> dict[str, Any]:
    """The JSON object in the file at `path`; {} where it is missing, unreadable or not an object."""
    with contextlib.suppress(OSError, ValueError):
        found = json.loads(Path(path).read_text(encoding="utf-8"))
        return found if isinstance(found, dict) else {}
    return {}


def prune(
    root: str, older_than_days: float | None = None, environment: dict[str, str] | None = None
) -> list[str]:
    """Remove the key folders under `root` last used more than `older_than_days` ago, or built by another
    environment than `environment` (torch build, GPU, Python: `pieceworks.key.software_factors()` is this
    one's); keep `<root>/inductor` and anything that is not a key folder. Returns the removed paths.
    Run it while no process uses those folders. Any other `environment` (the string form of an older
    pieceworks) is a TypeError: it would match no folder, and every key folder would go."""
    if environment is not None and not isinstance(environment, dict):
        got = f"{type(environment).__name__} {environment!r:.60}"
        raise TypeError(f"prune(environment=...) takes pieceworks.key.software_factors() (a dict), not {got}")
    removed = []
    for path in sorted(os.path.join(root, name) for name in os.listdir(root)):
        if not (factors := read_json_dict(os.path.join(path, "factors.json"))):  # not a key folder
            continue
        with contextlib.suppress(OSError):
            idle_s = time.time() - os.stat(path).st_mtime
            old = older_than_days is not None and idle_s > older_than_days * 86400
            if old or (environment is not None and factors.get("environment") != environment):
                shutil.rmtree(path)
                removed.append(path)
    return removed


def _open_lock(path: str) -> BinaryIO | None:
    """The lock file at `path` opened to append, else read-only (a read-only cache: a shared lock still keeps
    us from reading half of another writer's update); None where it cannot be opened."""
    for mode in ("ab", "rb"):
        with contextlib.suppress(OSError):
            return open(path, mode)
    return None


@contextlib.contextmanager
def _flocked(file: BinaryIO, operation: int, waiting_for: str | None = None) -> Iterator[None]:
    """Hold `flock(file, operation)` for the block, then close `file` (which releases it). `waiting_for`:
    the entry to log when another process holds the lock."""
    with file:
        try:
            fcntl.flock(file, operation | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting_for is not None:
                log.info("pieceworks cache: another process is compiling %s; waiting for it", waiting_for)
            fcntl.flock(file, operation)
        yield
