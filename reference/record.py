"""The serving record: a warm start that serves a cached model without tracing it.

A first call spends about a second in Dynamo's trace (a 12-layer model) before the backend looks at the cache. When
the model is cached, nothing in that trace is new. So the end of a traced first call stores the model's serving
record in the compile cache, and a later first call with the same `model_key` serves from it without entering
Dynamo: the record's Dynamo graph is unpickled, split, analysed and its pieces loaded (`compile_graph`, as in a
backend call: a piece the cache lost is compiled from the record's graph), and calls are bound as the traced call
proved (`Binder.describe`/`restore`).

A record holds the Dynamo graph with its FakeTensor and SymInt metadata (`_compat.pickle_graph`), the binding, the
outputs cut back to the batch, the arguments the graph writes, and the SHA-256 of every source file Dynamo traced.

When a record is used: its key (computed before tracing) matches, and the traced code is unchanged (checked on
load by its files' SHA-256; at save time each traced code object must still be what its file compiles to, so a file
edited after the process imported it gives no record). The key covers the environment (torch build, Triton,
Python, GPU), the config's `compute_hash`, Dynamo's configuration, the default dtype and autocast state, the model's
module tree (each module's class with the file it was loaded from, and its attributes, private ones included:
numbers, strings, bools, None, enums, dtypes, devices, functions by their code, lists, dicts and dataclasses of
them, objects with `to_dict()` such as transformers configs), its parameters and buffers (names, shapes, strides,
dtypes, devices, sharing), and the call's signature (`api.signature` of each argument: all but the batch size).
A model the key cannot cover gets no record and traces every time (logged at INFO): not an nn.Module, a class
without a source file (a notebook cell), forward hooks (its own or global), an attribute of another kind (an
object, a closure, a `functools.partial`). What the key still cannot see: code that reads a module global or an
environment variable; set `CompilationConfig.reuse_trace=False` for such a model.

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
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from . import _compat
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


class Unkeyable(ValueError):
    """Something the trace may depend on cannot be keyed: the model gets no record (every first call traces)."""


# nn.Module's own bookkeeping, and `_apply`, which binding.StateWatch wraps on each module a CompiledModel serves
_MODULE_INTERNALS = frozenset(vars(torch.nn.Module())) - {"training"} | {"_apply"}
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs")


def class_origin(kind: type) -> list[str]:
    """A class's module, name and the file it was loaded from (two `Model`s of two scripts differ)."""
    path = getattr(sys.modules.get(kind.__module__), "__file__", None)
    if not path or not os.path.isfile(path):
        raise Unkeyable(f"{kind.__qualname__} has no source file (a notebook cell, exec'd code)")
    return [kind.__module__, kind.__qualname__, os.path.abspath(path)]


def _value(value: Any, where: str) -> Any:
    """A plain stand-in for an attribute the trace may have read; functions by their code (a closure: unkeyable)."""
    if isinstance(value, types.FunctionType):
        if value.__closure__ or value.__defaults__ or value.__kwdefaults__:
            raise Unkeyable(f"{where} is a function with a closure or defaults")
        return [value.__module__, value.__qualname__, code_digest(value.__code__)]
    try:
        return portable(value, where)
    except (UnkeyableConfigError, RecursionError) as exc:
        raise Unkeyable(f"{where}: {exc}") from None


def plain_attributes(module: Any, where: str = "") -> dict[str, Any]:
    """A module's attributes, private ones included, but nn.Module's own bookkeeping, tensors and submodules (keyed
    apart): each a plain value (see the module doc), else `Unkeyable`; a module with forward hooks is unkeyable."""
    if any(getattr(module, hooks, None) for hooks in _HOOKS):
        raise Unkeyable(f"{where or 'the model'} has forward hooks")
    return {name: _value(value, f"{where}.{name}") for name, value in sorted(vars(module).items())
            if name not in _MODULE_INTERNALS and not isinstance(value, (torch.Tensor, torch.nn.Module))}


def model_key(model: Any, signatures: Sequence[tuple], config: CompilationConfig) -> str | None:
    """The key of `model` called with arguments of `signatures` (`api.signature`) under `config` (see the module
    doc), or None (logged at INFO) for a model a record cannot be keyed for: not an nn.Module, a class without a
    source file, forward hooks, an attribute of another type."""
    if not isinstance(model, torch.nn.Module):
        return None
    try:
        modules = [[name, class_origin(type(m)), plain_attributes(m, name)]
                   for name, m in model.named_modules(remove_duplicate=False)]
        if _compat.global_module_hooks():
            raise Unkeyable("global module hooks are registered")
    except Unkeyable as exc:
        log.info("pieceworks: no serving record for this model (%s): every first call traces", exc)
        return None
    first: dict[int, str] = {}
    state = [[name, list(t.shape), list(t.stride()), str(t.dtype), str(t.device), first.setdefault(id(t), name)]
             for name, t in (*model.named_parameters(remove_duplicate=False),
                             *model.named_buffers(remove_duplicate=False))]
    modes = {"default_dtype": str(torch.get_default_dtype()), "dynamo": _dynamo_config(),
             "autocast": [[d, torch.is_autocast_enabled(d), str(torch.get_autocast_dtype(d))] for d in ("cpu", "cuda")]}
    facts = {"version": RECORD_VERSION, "environment": environment_factors(), "config": config.compute_hash(),
             "modules": modules, "state": state, "call": [repr(s) for s in signatures], "modes": modes}
    return digest(json.dumps(facts, sort_keys=True, default=repr))[:24]


def _dynamo_config() -> dict[str, Any]:
    """Dynamo's configuration, each value as `portable` keys it (one it cannot, such as a set of functions, by its
    type: the same in every process)."""
    found = {}
    for name, value in sorted(_compat.dynamo_config().items()):
        try:
            found[name] = portable(value, name)
        except (UnkeyableConfigError, RecursionError):
            found[name] = type(value).__name__
    return found


def code_digest(code: types.CodeType) -> str:
    """What a code object computes: its bytecode, names and constants (nested code objects by their own digest)."""
    consts = [code_digest(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts]
    return digest(code.co_code.hex(), repr(code.co_names), *consts)


def _compiled_code(path: str) -> dict[tuple[str, int], str]:
    """`code_digest` of every function and class body in the file at `path` as it is on disk now, by (qualified
    name, first line)."""
    found, todo = {}, [compile(Path(path).read_bytes(), path, "exec", dont_inherit=True)]
    while todo:
        code = todo.pop()
        found[(code.co_qualname, code.co_firstlineno)] = code_digest(code)
        todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return found


def file_digests(codes: Sequence[types.CodeType]) -> dict[str, str]:
    """SHA-256 of the file of each traced code object, after checking that the file still holds that code: a file
    edited after the process imported it would pair the old graph with the new file. `Unkeyable` where a traced
    code object has no file, or its file no longer compiles to it."""
    digests, compiled = {}, {}
    for code in codes:
        path = code.co_filename
        if not os.path.isfile(path):
            raise Unkeyable(f"traced code {code.co_qualname} has no source file ({path})")
        if path not in compiled:
            compiled[path] = _compiled_code(path)
            digests[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        if compiled[path].get((code.co_qualname, code.co_firstlineno)) != code_digest(code):
            raise Unkeyable(f"{path} changed since it was imported ({code.co_qualname})")
    return digests


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
