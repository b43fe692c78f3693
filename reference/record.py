"""The serving record: a warm start that serves a cached model without tracing it.

A first call spends about a second in Dynamo's trace (a 12-layer model) before the backend looks at the cache. When
the model is cached, nothing in that trace is new. So the end of a traced first call stores the model's serving
record in the compile cache, and a later first call with the same `model_key` serves from it without entering
Dynamo: the record's Dynamo graph is unpickled, split, analysed and its pieces loaded (`compile_graph`, as in a
backend call: a piece the cache lost is compiled from the record's graph), and calls are bound as the traced call
proved (`Binder.describe`/`restore`).

A record holds the Dynamo graph with its FakeTensor and SymInt metadata (`_compat.pickle_graph`), the binding, the
outputs cut back to the batch, the arguments the graph writes, and the SHA-256 of every source file Dynamo traced.

When a record is used: its key (computed before tracing) matches, and the traced files are unchanged (checked on
load). The key covers the environment (torch build, Triton, Python, GPU), the config's `compute_hash`, the model's
class and module tree (each module's class and plain attributes: numbers, strings, bools, None, enums, dtypes,
devices, callables by name, lists, dicts and dataclasses of them, objects with `to_dict()` such as transformers
configs), its parameters and buffers (names, shapes, dtypes, devices, sharing), and the call's signature (`api.
signature` of each argument: everything but the batch size). A forward whose code depends on anything else (a
module global, an environment variable, an attribute of another type) can change without changing the key: set
`CompilationConfig.reuse_trace=False` for such a model.

Faults: a record that is missing, unreadable, of another version, or whose traced files changed is not used (the
cache logs a damaged one; a changed file is logged at INFO); one that cannot be rebuilt (a graph this torch cannot
unpickle or compile) gives one WARNING. Either way the call traces as before and stores a fresh record. Storage is the compile cache's (cache.py: atomic, checksummed and locked; read-only and unusable
caches handled there), in a key folder `model-<key>` of its own. A record is a pickle: like the Inductor artifacts
beside it, it runs code when loaded, so a cache folder must be as trusted as the code it caches.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from .cache import CompileCache
from .config import CompilationConfig
from .key import UnkeyableConfigError, digest, portable, environment_factors

log = logging.getLogger("pieceworks")

RECORD_VERSION = 1
ENTRY = "serving-record"


class Record(NamedTuple):
    """What a warm start needs to serve without tracing (see the module doc)."""

    graph: bytes  # the Dynamo graph, `_compat.pickle_graph`
    binding: tuple  # `Binder.describe`
    batched_outputs: Any  # `padding.batched_outputs`
    mutated_args: list[int]  # argument positions the graph writes in place
    files: dict[str, str]  # traced source file -> SHA-256


def _name(kind: type) -> str:
    return f"{kind.__module__}.{kind.__qualname__}"


def plain_attributes(module: Any) -> dict[str, Any]:
    """A module's public plain attributes (see the module doc); tensors, submodules and other objects are left out
    (tensors and submodules have keys of their own)."""
    plain = {}
    for name, value in sorted(vars(module).items()):
        if name.startswith("_") or isinstance(value, (torch.Tensor, torch.nn.Module)):
            continue
        try:
            plain[name] = portable(value, name)
        except (UnkeyableConfigError, RecursionError):
            continue
    return plain


def model_key(model: Any, signatures: Sequence[tuple], config: CompilationConfig) -> str:
    """The key of `model` called with arguments of `signatures` (`api.signature`) under `config`: see the module
    doc for what it covers."""
    if isinstance(model, torch.nn.Module):
        modules = [[name, _name(type(m)), plain_attributes(m)]
                   for name, m in model.named_modules(remove_duplicate=False)]
        first: dict[int, str] = {}
        state = [[name, list(t.shape), str(t.dtype), str(t.device), first.setdefault(id(t), name)]
                 for name, t in (*model.named_parameters(remove_duplicate=False),
                                 *model.named_buffers(remove_duplicate=False))]
    else:
        modules, state = [[_name(type(model)), getattr(model, "__qualname__", "")]], []
    facts = {"version": RECORD_VERSION, "environment": environment_factors(), "config": config.compute_hash(),
             "modules": modules, "state": state, "call": [repr(s) for s in signatures]}
    return digest(json.dumps(facts, sort_keys=True, default=repr))[:24]


def file_digests(paths: Sequence[str]) -> dict[str, str]:
    """SHA-256 of each path that is a file (Dynamo also lists code without one, such as `<string>`)."""
    return {path: hashlib.sha256(Path(path).read_bytes()).hexdigest() for path in paths if os.path.isfile(path)}


def changed_file(files: dict[str, str]) -> str | None:
    """The first traced file that is gone or differs from its digest, or None."""
    for path, sha in sorted(files.items()):
        try:
            if hashlib.sha256(Path(path).read_bytes()).hexdigest() != sha:
                return path
        except OSError:
            return path
    return None


def _store(config: CompilationConfig, key: str) -> CompileCache | None:
    return CompileCache.open(config.resolved_cache_dir(), f"model-{key}", {"environment": environment_factors(),
                                                                           "model": key})


def save(config: CompilationConfig, key: str, record: Record) -> bool:
    """Store `record` under `key`; False (logged by the cache) where it cannot be written."""
    cache = _store(config, key)
    data = pickle.dumps((RECORD_VERSION, tuple(record)), protocol=pickle.HIGHEST_PROTOCOL)
    return cache is not None and cache.store(ENTRY, lambda path: Path(path).write_bytes(data))


def _read(path: str) -> Record:
    version, fields = pickle.loads(Path(path).read_bytes())  # noqa: S301 - see the module doc on trust
    if version != RECORD_VERSION:
        raise ValueError(f"a version-{version} record, this pieceworks reads version {RECORD_VERSION}")
    return Record(*fields)


def load(config: CompilationConfig, key: str) -> Record | None:
    """The record stored under `key` whose traced files are unchanged, or None."""
    cache = _store(config, key)
    record = None if cache is None else cache.load(ENTRY, _read)[0]
    if record is not None and (path := changed_file(record.files)) is not None:
        log.info("pieceworks: %s changed since this model's serving record was stored: tracing the model", path)
        return None
    return record
