"""The on-disk compile cache.

Layout: `<cache_dir>/<key>/` where `key` digests everything that changes compiled code (the traced graph with its
input metadata, the config hash, the torch/Triton/Python build and the GPU) and nothing that varies per run. Inside:
`index.json` maps an entry name (`range:1-8192|<piece fingerprint>` or `size:4|<piece fingerprint>`) to an
artifact file and its SHA-256; `artifacts/` holds the files; `factors.json` records the key's inputs for people.

Contracts:
- every file is written to a temporary name in the same folder, fsynced and renamed: a reader sees the old file or
  the new one, never half of one;
- writers take an exclusive `flock` on `index.lock` to install an artifact and merge the index (read, update,
  write), so concurrent processes never lose each other's entries or pair an index hash with another file;
  readers take a shared lock while they check and load;
- the index is JSON, read with `json.loads` (no eval, no pickle), with a SHA-256 over its entries; an index that
  does not parse or does not match its digest is logged and treated as empty;
- an artifact whose bytes do not match the index's SHA-256 (truncated, garbled, overwritten) is never loaded: it is
  logged with its path and the caller recompiles. An artifact that fails to load (another torch build) likewise.
POSIX only (`fcntl`). Safe across processes; one `CompileCache` object is not meant to be shared by threads.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from .counters import counters

__all__ = ["CompileCache", "CacheIndexError", "atomic_write", "cache_key", "parse_index", "serialize_index",
           "INDEX_VERSION"]

log = logging.getLogger("pieceworks")

INDEX_VERSION = 1


class CacheIndexError(ValueError):
    """The index file is not a pieceworks index of this version. The message says what is wrong."""


def cache_key(factors: dict[str, str]) -> str:
    """The cache folder name for `factors` (name -> digest): equal factors, equal key, in any process."""
    blob = json.dumps(factors, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _entries_digest(entries: dict[str, dict[str, Any]]) -> str:
    return hashlib.sha256(json.dumps(entries, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def serialize_index(entries: dict[str, dict[str, Any]]) -> bytes:
    """The index file's bytes: JSON with the entries and a SHA-256 over them (so no edit goes unnoticed)."""
    doc = {"version": INDEX_VERSION, "entries": entries, "sha256": _entries_digest(entries)}
    return json.dumps(doc, sort_keys=True, indent=1).encode()


def parse_index(data: bytes) -> dict[str, dict[str, Any]]:
    """Parse index bytes; raise `CacheIndexError` naming the problem for anything but an intact index."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise CacheIndexError(f"not JSON ({exc})") from None
    if not isinstance(doc, dict) or doc.get("version") != INDEX_VERSION or not isinstance(doc.get("entries"), dict):
        raise CacheIndexError(f"not a version-{INDEX_VERSION} pieceworks index")
    entries = doc["entries"]
    for name, entry in entries.items():
        if not (
            isinstance(entry, dict)
            and set(entry) == {"file", "sha256", "bytes"}
            and isinstance(entry["file"], str)
            and isinstance(entry["sha256"], str)
            and isinstance(entry["bytes"], int)
            and not isinstance(entry["bytes"], bool)
            and os.path.basename(entry["file"]) == entry["file"]
            and entry["file"] not in ("", ".", "..")
            and not entry["file"].startswith(".")
        ):
            raise CacheIndexError(f"entry {name!r} is malformed: {entry!r}")
    if doc.get("sha256") != _entries_digest(entries):
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


def _sha256_file(path: str) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            size += len(block)
    return h.hexdigest(), size


class CompileCache:
    """Artifacts of one (graph, config, environment) key under `root`."""

    def __init__(self, root: str, key: str, factors: dict[str, str] | None = None) -> None:
        self.directory = os.path.join(root, key)
        self.artifact_dir = os.path.join(self.directory, "artifacts")
        self.index_path = os.path.join(self.directory, "index.json")
        os.makedirs(self.artifact_dir, exist_ok=True)
        factors_path = os.path.join(self.directory, "factors.json")
        if factors and not os.path.exists(factors_path):
            atomic_write(factors_path, json.dumps(factors, sort_keys=True, indent=1).encode())

    @contextlib.contextmanager
    def _locked(self, exclusive: bool) -> Iterator[None]:
        with open(os.path.join(self.directory, "index.lock"), "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def read_index(self) -> dict[str, dict[str, Any]]:
        """The index's entries; `{}` (logged) when the file is missing or unreadable."""
        try:
            with open(self.index_path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return {}
        try:
            return parse_index(data)
        except CacheIndexError as exc:
            log.warning("pieceworks cache index %s is unreadable (%s); ignoring it and recompiling", self.index_path, exc)
            return {}

    def load(self, name: str, loader: Callable[[str], Any]) -> Any | None:
        """Return `loader(path)` for entry `name`, or None (a miss) when absent, corrupt or unloadable."""
        with self._locked(exclusive=False):
            entry = self.read_index().get(name)
            if entry is None:
                return None
            path = os.path.join(self.artifact_dir, entry["file"])
            try:
                sha, size = _sha256_file(path)
            except OSError as exc:
                return self._reject(path, f"cannot be read ({exc})")
            if (sha, size) != (entry["sha256"], entry["bytes"]):
                return self._reject(
                    path, f"has {size} bytes with SHA-256 {sha[:12]}…, the index says {entry['bytes']} bytes "
                    f"with {entry['sha256'][:12]}… (truncated or garbled)"
                )
            try:
                loaded = loader(path)
            except Exception as exc:  # noqa: BLE001 - any failure to load means: recompile
                return self._reject(path, f"failed to load ({type(exc).__name__}: {exc})")
        counters.num_compiled_artifacts_loaded += 1
        return loaded

    def _reject(self, path: str, why: str) -> None:
        counters.num_cache_artifacts_rejected += 1
        log.warning("pieceworks cache artifact %s %s; not loading it, recompiling", path, why)
        return None

    def store(self, name: str, save: Callable[[str], None]) -> bool:
        """Save an artifact with `save(tmp_path)` and record it as entry `name`. False (logged) if `save` fails."""
        fd, tmp = tempfile.mkstemp(dir=self.artifact_dir, prefix=".tmp-")
        os.close(fd)
        os.unlink(tmp)  # CompiledArtifact.save writes the path itself
        try:
            save(tmp)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            sha, size = _sha256_file(tmp)
        except Exception as exc:  # noqa: BLE001 - an unsaveable artifact still runs; it just is not cached
            log.warning("pieceworks could not save the artifact for %s (%s: %s); it will be recompiled next time",
                        name, type(exc).__name__, exc)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            return False
        file = hashlib.sha256(name.encode()).hexdigest()[:32] + ".bin"
        with self._locked(exclusive=True):
            os.replace(tmp, os.path.join(self.artifact_dir, file))
            entries = self.read_index()
            entries[name] = {"file": file, "sha256": sha, "bytes": size}
            atomic_write(self.index_path, serialize_index(entries))
        counters.num_compiled_artifacts_saved += 1
        counters.num_cache_entries_updated += 1
        return True
