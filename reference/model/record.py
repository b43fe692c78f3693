"""The serving record: a warm start that serves a cached model without tracing it.

A first call spends about a second in Dynamo's trace (a 12-layer model) before the backend looks at the cache.
When the model is cached, nothing in that trace is new. So the end of a traced first call stores the model's
serving record in the compile cache, and a later first call with the same key (`key_of(model_facts(...))`)
serves from it without entering Dynamo: the record's split of the Dynamo graph is unpickled and its pieces
loaded (`compile_pieces`, as in a backend call, but with nothing to split or analyse: a piece the cache lost
is compiled from the record's piece), and calls are bound as the traced call proved
(`Binder.describe`/`restore`).

A record holds the split (`core.split_pieces`: the stitching module and the analysed pieces) with the
FakeTensor and SymInt metadata a piece keeps once analysed (`piece.drop_unread_values`: what loading and
compiling it read; `_compat.pickle_graph`), the binding, the outputs cut back to the batch, the
arguments the graph writes, and the identity of every file Dynamo traced code from (`file_identity`): a file
of an installed distribution (under site-packages: torch, transformers) by the distribution's name and
version, a frozen standard-library module (`<frozen _collections_abc>`) by its name and the Python version,
any other file (the user's code, an editable install) by its SHA-256; code made at run time (a dataclass's
`__init__`) by the file of the module its function belongs to.

When a record is used: its key (computed before tracing) matches, and the traced code is unchanged (checked on
load by each file's identity: a library's version, a file's SHA-256; at save time each traced code object of a
file known by its SHA-256 must still be what its file compiles to, so a file edited after the process imported
it gives no record; a library's files edited in place, its version unchanged, are not seen). The key covers
the environment (torch build, Triton, Python, GPU), the config's `compute_hash`, Dynamo's configuration, the
default dtype and autocast state, the model's module tree (each module's class with the file it was loaded
from, and its attributes, private ones included: numbers, strings, bools, None, enums, dtypes, devices,
functions by their code, a `functools.partial` by its function and arguments, lists, dicts and dataclasses of
them, an object with `uuid()` by it (per-call state such as an attention's host plan declares a constant one),
objects with `to_dict()` such as transformers configs), its parameters and buffers (names, shapes, strides,
dtypes, devices, sharing), and the call's signature (`arguments.signature` of each argument: all but the batch
size; the keywords of a call made with them). What the trace read outside the model's module tree and the call
(module globals, closure cells, functions' defaults, class attributes, a dict's keys where a guard reads only
those: Dynamo's guards name them) is in the record as plain stand-ins, read back as a warm start will
(`outside_reads`); a record whose values differ now is not used, and the log names the value (`changed_read`).
A model the key cannot cover gets no record and traces every time: a callable that is not an nn.Module (not
logged: such a model has no state to key), and, logged at INFO, a class without a source file (a notebook
cell), forward hooks of its own (a global one refuses every call: watch.py), an attribute of another type (an
object, a closure), a value read outside the model that cannot be compared across processes or read back,
traced code without a source file or module of one (`os.environ` read inside `forward`, code a notebook cell
made).

A missing record whose model class has one under another key is explained: each record's folder keeps its
key's facts (`model_facts`, by name, in factors.json), and `load` logs the first that differs from the newest
such record's (`key_change`).

Faults: a record that is missing, unreadable, of another version, or whose traced files changed is not used
(the cache logs a damaged one; a changed file is logged at INFO); one that cannot be rebuilt (a graph this
torch cannot unpickle or compile) gives one WARNING. Either way the call traces as before and stores a fresh
record. Storage is the compile cache's (cache.py: atomic, checksummed and locked; read-only and unusable
caches handled there), in a key folder `model-<key>` of its own. A record is a pickle: like the Inductor
artifacts beside it, it runs code when loaded, so a cache folder must be as trusted as the code it caches.
"""

from __future__ import annotations

import builtins
import contextlib
import functools
import gc
import importlib.metadata
import os
import pickle
import platform
import re
import sys
import types
from collections import namedtuple
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from .. import core
from ..core import CompilationConfig, log
from . import _compat
from .binding import named_state
from .watch import MODES, global_modes, original_class

RECORD_VERSION = 7  # in the key: a record of another version is never found
ENTRY = "serving-record"


# What a warm start needs to serve without tracing (see the module doc): `graph`, the split of the Dynamo
# graph (`_compat.pickle_graph`); `binding` (`Binder.describe`); `batched_outputs`
# (`padding.batched_outputs`); `mutated_args`, the argument positions the graph writes in place; `files`,
# traced source file -> `file_identity`; `reads`, the `outside_reads`, each (Dynamo's source, guard type,
# stand-in of the value) (a tracing call's own are its `outside_sources`); `batch_guards`
# (`arguments.batch_guards`).
Record = namedtuple("Record", "graph binding batched_outputs mutated_args files reads batch_guards")


class Unkeyable(ValueError):
    """Something the trace may depend on cannot be keyed: the model gets no record (every first call
    traces)."""


# nn.Module's own bookkeeping
_MODULE_INTERNALS = frozenset(vars(torch.nn.Module())) - {"training"}


def class_origin(cls: type) -> list[str]:
    """A class's module, name and the file it was loaded from (two `Model`s of two scripts differ)."""
    path = getattr(sys.modules.get(cls.__module__), "__file__", None)
    if not path or not os.path.isfile(path):
        raise Unkeyable(f"{cls.__qualname__} has no source file (a notebook cell, exec'd code)")
    return [cls.__module__, cls.__qualname__, os.path.abspath(path)]


def plain_value(value: Any, where: str, closures: bool = False) -> Any:
    """A plain stand-in for a value the trace may have read: a function by its module, name and code (one
    with a closure or defaults is unkeyable, unless `closures`: Dynamo guards those apart), a
    `functools.partial` by its function and bound arguments, anything else as the key's `portable`; else
    `Unkeyable`."""
    if isinstance(value, types.FunctionType):
        if not closures and (value.__closure__ or value.__defaults__ or value.__kwdefaults__):
            raise Unkeyable(f"{where} is a function with a closure or defaults")
        return [value.__module__, value.__qualname__, code_digest(value.__code__)]
    if isinstance(value, functools.partial):  # a function and the arguments bound to it
        return [plain_value(v, where, closures) for v in (value.func, value.args, value.keywords)]
    try:
        return core.portable(value, where)
    except (core.UnkeyableConfigError, RecursionError) as exc:
        raise Unkeyable(f"{where}: {exc}") from None


def plain_attributes(module: Any, where: str = "") -> dict[str, Any]:
    """A module's attributes, private ones included, but nn.Module's own bookkeeping, tensors and
    submodules (keyed apart): each a plain value (see the module doc), else `Unkeyable`; a module with
    forward hooks is unkeyable."""
    if module._forward_hooks or module._forward_pre_hooks:  # the `_with_kwargs` tables are subsets
        raise Unkeyable(f"{where or 'the model'} has forward hooks")
    apart = (torch.Tensor, torch.nn.Module)
    own = {n: v for n, v in vars(module).items() if n not in _MODULE_INTERNALS and not isinstance(v, apart)}
    return {name: plain_value(value, f"{where}.{name}") for name, value in sorted(own.items())}


def model_facts(model: Any, signatures: Sequence[tuple], config: CompilationConfig) -> dict[str, Any] | None:
    """What the key of `model` called with arguments of `signatures` (`arguments.signature`) under `config`
    covers (see the module doc), by name; None for a model a record cannot be keyed for: not an nn.Module,
    or (logged at INFO) a class without a source file, forward hooks, an attribute of another type."""
    if not isinstance(model, torch.nn.Module):
        return None
    try:
        modules = {}
        for name, m in model.named_modules(remove_duplicate=False):
            origin = class_origin(original_class(type(m)))
            modules[name or "<root>"] = {"class": origin, "attributes": plain_attributes(m, name)}
    except Unkeyable as exc:
        log.info("pieceworks: no serving record for this model (%s): every first call traces", exc)
        return None
    # the modes the state watch reads per call, the default device they count, Dynamo's configuration
    modes: dict[str, Any] = dict(zip(MODES, map(str, global_modes())), device=str(torch.get_default_device()))
    modes["dynamo"] = _dynamo_config()
    facts = {"version": RECORD_VERSION, "environment": core.software_factors()}
    facts |= {"config": config.hash_factors(), "modules": modules, "state": (state := state_facts(model))}
    facts |= {"call": [repr(s) for s in signatures], "modes": modes}
    # the dicts' keys are sorted when digested
    return facts | {"order": {"modules": list(modules), "state": list(state)}}


def key_of(facts: dict[str, Any]) -> str:
    """The serving record's key: a digest of `model_facts` (as `cache_key` digests a graph's factors)."""
    return core.cache_key(facts)


def state_facts(model: torch.nn.Module) -> dict[str, dict[str, Any]]:
    """Each parameter and buffer of `model` by name (shared ones under each name): shape, strides, dtype,
    device, and the first name of its tensor (which are shared)."""
    first: dict[int, str] = {}
    return {name: _layout(t) | {"shares": first.setdefault(id(t), name)} for name, t in named_state(model)}


def _layout(t: torch.Tensor) -> dict[str, Any]:
    return {"shape": [*t.shape], "strides": [*t.stride()], "dtype": str(t.dtype), "device": str(t.device)}


def _dynamo_config() -> dict[str, Any]:
    """Dynamo's configuration, each value as `portable` keys it (one it cannot, such as a set of functions,
    by its type: the same in every process), but folders (`debug_dir_root` is in the working directory): the
    same model started from another folder is the same model."""
    found = {}
    for name, value in sorted(_compat.dynamo_config().items()):
        found[name] = type(value).__name__
        with contextlib.suppress(core.UnkeyableConfigError, RecursionError):
            found[name] = core.portable(value, name)
    # a folder (the working directory's) is not code; `portable` keeps a string as it is
    return {name: v for name, v in found.items() if not (isinstance(v, str) and os.path.isabs(v))}


def code_digest(code: types.CodeType) -> str:
    """What a code object computes: its bytecode, names and constants (nested code objects by their own
    digest)."""
    consts = [code_digest(c) if isinstance(c, types.CodeType) else repr(c) for c in code.co_consts]
    return core.digest(code.co_code.hex(), repr(code.co_names), *consts)


def _compiled_code(path: str) -> dict[tuple[str, int], str]:
    """`code_digest` of every function and class body in the file at `path` as it is on disk now, by
    (qualified name, first line)."""
    found, todo = {}, [compile(Path(path).read_bytes(), path, "exec", dont_inherit=True)]
    while todo:
        code = todo.pop()
        found[(code.co_qualname, code.co_firstlineno)] = code_digest(code)
        todo += [c for c in code.co_consts if isinstance(c, types.CodeType)]
    return found


_FROZEN = re.compile(r"<frozen ([\w.]+)>")
_ENVIRON_FILE = type(os.environ).__getitem__.__code__.co_filename  # os.py, or "<frozen os>"


def source_file(code: types.CodeType) -> str:
    """The file `code` is keyed by: its own; `<frozen name>` for a frozen standard-library module; for code
    made at run time (a dataclass's `__init__`), the file of the module its function belongs to.
    `Unkeyable` where there is none (code a notebook cell or `exec` made, `os.environ` read inside
    `forward`)."""
    if os.path.isfile(path := code.co_filename) or _FROZEN.fullmatch(path):
        return path
    functions = [fn for fn in gc.get_referrers(code) if isinstance(fn, types.FunctionType)]
    for file in (getattr(sys.modules.get(fn.__module__ or ""), "__file__", None) for fn in functions):
        if file and os.path.isfile(file):
            return file
    raise Unkeyable(f"traced code {code.co_qualname} has no source file ({path})")


def _distribution_names(path: str) -> Iterator[str]:
    """The names the installed distribution (`importlib.metadata`) of a file under site-packages or
    dist-packages may have: its top-level package or module's own name, then the names
    `packages_distributions` gives for it (read only where that name is no distribution's); none for
    another file."""
    parts = Path(path).parts
    if sites := [i for i, part in enumerate(parts[:-1]) if part in ("site-packages", "dist-packages")]:
        yield (top := parts[sites[-1] + 1].removesuffix(".py"))
        yield from importlib.metadata.packages_distributions().get(top, ())


def file_identity(path: str) -> str:
    """What a traced file is known by: a frozen standard-library module by its name and the Python version,
    a file of an installed distribution (under site-packages) by the distribution's name and version (the
    first of `_distribution_names` installed), any other file by its SHA-256 (`OSError` where it cannot be
    read)."""
    if frozen := _FROZEN.fullmatch(path):
        return f"frozen {frozen.group(1)}, Python {platform.python_version()}"
    for name in _distribution_names(path):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            dist = importlib.metadata.distribution(name)
            return f"{dist.metadata['Name']} {dist.version}"
    return "sha256:" + core.file_sha256(path)[0]


def reads_environment(code: types.CodeType) -> bool:
    """Whether `code` is `os.environ`'s: what `os.environ[...]`, `os.environ.get` and `os.getenv` run."""
    return code.co_filename == _ENVIRON_FILE and code.co_qualname.startswith("_Environ.")


def file_digests(codes: Sequence[types.CodeType]) -> dict[str, str]:
    """`file_identity` of the file of each traced code object (`source_file`); a file known by its SHA-256
    must still hold that code (a file edited after the process imported it would pair the old graph with
    the new file). `Unkeyable` where a traced code object has no file, or its file no longer compiles to
    it, or it reads `os.environ` (Dynamo guards no value `os.getenv` reads: a warm start could not check
    it)."""
    digests, compiled = {}, functools.cache(_compiled_code)
    for code in codes:
        if reads_environment(code):
            raise Unkeyable("the trace read an environment variable (os.environ, os.getenv) inside forward")
        if (path := source_file(code)) not in digests:
            digests[path] = file_identity(path)
        by_sha256 = digests[path].startswith("sha256:") and path == code.co_filename
        if by_sha256 and compiled(path).get((code.co_qualname, code.co_firstlineno)) != code_digest(code):
            raise Unkeyable(f"{path} changed since it was imported ({code.co_qualname})")
    return digests


def changed_file(files: dict[str, str]) -> str | None:
    """The first traced file that is gone or whose `file_identity` differs (with both, for a library's
    version), or None."""
    for path, identity in sorted(files.items()):
        try:
            if (now := file_identity(path)) != identity:
                return path if now.startswith("sha256:") else f"{path} ({identity} then, {now} now)"
        except OSError:  # gone
            return path
    return None


# Guards whose values the key covers or that hold nothing to compare: the call's tensors and the model's
# parameters and buffers (signature and state in the key), hook tables (a model with hooks has no record),
# aliases of another source.
_COVERED = {"TENSOR_MATCH", "EMPTY_NN_MODULE_HOOKS_DICT", "NOT_PRESENT_IN_GENERIC_DICT", "DUPLICATE_INPUT"}
# A source inside the model's module tree (an attribute or entry of a module, its `_modules` table): the key
# covers it.
_MODEL_STATE = re.compile(r"(L\['model'\]|model)(\.[A-Za-z_]\w*|\['[^']*'\]|\[\d+\])*")
_CALL = re.compile(r"(L\['(args|kwargs)'\]|args|kwargs)\b")
# torch's tables of global module hooks: a forward hook refuses the call before the key is made (watch.py:
# `refuse_global_hooks`), the others (registration hooks, pieceworks' own among them; backward hooks) do not
# change an inference trace
_GLOBAL_HOOKS = re.compile(r"G\['__import_torch_dot_nn_dot_modules_dot_module'\]\._global_\w+_hooks")
# Guards on a dict's keys alone: its keys stand for it
KEYS_GUARDS = {"DICT_KEYS_MATCH", "DICT_NOT_CONTAINS", "DICT_CONTAINS"}
# A value Dynamo put in the frame's globals under a name of this process: `_<its id>_c<compile id>`
_BY_ID = re.compile(r"G\['(\w*?_(\d+)_c\d+)'\]")


def _named_by_id(found: re.Match, frame_globals: dict[str, Any]) -> Any:
    """The value `_BY_ID` found, where it is one of Dynamo's by-id names (the id is its own), else None."""
    value = frame_globals.get(found.group(1))
    return value if value is not None and id(value) == int(found.group(2)) else None


def portable_source(source: str, frame_globals: dict[str, Any]) -> str:
    """`source` with each module Dynamo named by its id in this process (`_BY_ID`) named by its import, as a
    warm start resolves it (`_Globals`); other values so named stay (`outside_reads` refuses them)."""

    def by_import(found: re.Match) -> str:
        module = _named_by_id(found, frame_globals)
        if not isinstance(module, types.ModuleType) or sys.modules.get(module.__name__) is not module:
            return found.group(0)
        return f"G['__import_{module.__name__.replace('.', '_dot_')}']"

    return _BY_ID.sub(by_import, source)


class _Globals(dict):
    """The traced frame's globals as Dynamo's guard sources name them. While it traces, Dynamo installs
    there the modules of inlined code as `__import_<name, dots as _dot_>` and their builtins as
    `__builtins_dict___<n>`: a warm start, which has not traced, resolves those names itself."""

    def __init__(self, frame_globals: dict[str, Any]) -> None:  # empty itself: `dict.__init__` adds nothing
        self.frame = frame_globals

    def __missing__(self, name: str) -> Any:
        if name.startswith("__import_"):
            return importlib.import_module(name[len("__import_") :].replace("_dot_", "."))
        return vars(builtins) if name.startswith("__builtins_dict__") else self.frame[name]


def read_back(source: str, model: Any, frame_globals: dict[str, Any]) -> Any:
    """The value at Dynamo's guard `source` now: `G[...]` the traced frame's globals, `model` the model,
    and the few builtins Dynamo's sources call (`type`: a module's own class, watched or not, watch.py;
    `object.__getattribute__(x, name)`: a generic attribute read, as of a Hugging Face config's `__dict__`).
    The source is from a record, which is trusted as code is (see the module doc)."""
    names = {name: vars(builtins)[name] for name in ("dict", "list", "getattr", "__import__", "object")}
    names |= {"__builtins__": {}, "G": _Globals(frame_globals), "L": {"model": model}, "model": model}
    # a served model's modules are of watched classes
    names["type"] = lambda value: original_class(type(value))
    return eval(source, names)  # noqa: S307


# A class's own entry, as Dynamo names a class attribute: `dict(owner.__dict__)['NAME']`, read as `owner.NAME`
_OWN_ENTRY = re.compile(r"dict\((.+?)\.__dict__\)\['(\w+)'\]")


def _readable(source: str) -> str:
    """`G['__import_a_dot_b'].X` as `a.b.X`, `G['__builtins_dict___0']['len']` as `builtins['len']`,
    `dict(type(model).__dict__)['X']` as `type(model).X`."""
    source = _OWN_ENTRY.sub(r"\1.\2", source)
    source = re.sub(r"G\['__import_(\w+)'\]", lambda m: m.group(1).replace("_dot_", "."), source)
    return re.sub(r"G\['(\w+)'\]", r"\1", re.sub(r"G\['__builtins_dict___\d+'\]", "builtins", source))


def stand_in(value: Any, guard: str, source: str) -> Any:
    """A plain value standing for what guard `guard` compares at `source`, the same in every process: a
    type by name (TYPE_MATCH), a dict whose keys the guard reads by its keys, a module by name, a function
    or code object by name and code, anything else as the key's `portable`."""
    value = type(value) if guard == "TYPE_MATCH" else value
    if guard in KEYS_GUARDS and isinstance(value, dict):
        return sorted(map(str, value))
    if isinstance(value, types.CodeType):
        return [value.co_qualname, code_digest(value)]
    if isinstance(value, types.ModuleType):
        return f"module {value.__name__}"
    try:
        return plain_value(value, source, closures=True)
    except Unkeyable:
        what = f"a {type(value).__name__} that cannot be compared across processes"
        raise Unkeyable(f"the trace read {_readable(source)}, {what}") from None


def outside_sources(guards: Sequence[Any], frame_globals: dict[str, Any]) -> list[tuple[str, str]]:
    """Of Dynamo's guard entries, those on what the trace read outside the model's module tree and the call:
    (`portable_source`, guard type)."""
    found = []
    for guard in guards:
        source, guard_type = portable_source(guard.name, frame_globals), guard.guard_type
        covered = not guard.has_value or guard_type in _COVERED or _CALL.match(source)
        in_model = not guard.is_global and "__" not in source and _MODEL_STATE.fullmatch(source)
        if not (covered or in_model or _GLOBAL_HOOKS.match(source)):
            found.append((source, guard_type))
    return found


_HOLDERS = (types.ModuleType, type, types.CellType)  # what the state watch reads attributes of


def watched_reads(sources: Iterable[str], model: Any, frame_globals: dict[str, Any]) -> list[tuple]:
    """Of `outside_sources`, those that read an attribute of a module, a class or a closure cell
    (`G['__import_m'].NAME`, `m.F.linear`, `type(model).SCALE`, `f.__closure__[0].cell_contents`), once each:
    (its readable name, the object it is read from, the attribute). Nothing announces a change to one, so the
    state watch reads them per call (watch.py)."""
    found = {}
    for source in sources:
        owner, _, name = _OWN_ENTRY.sub(r"\1.\2", source).rpartition(".")  # each `owner.NAME` read
        with contextlib.suppress(Exception):  # an owner a warm start cannot read back
            if isinstance(held := read_back(owner, model, frame_globals), _HOLDERS):
                found[id(held), name] = (_readable(source), held, name)
    return list(found.values())


def outside_reads(guards: Sequence[Any] | None, model: Any, frame_globals: dict[str, Any]) -> list[tuple]:
    """What the trace read outside the model's module tree and the call, from Dynamo's guard entries
    (`guards`, as `guard_filter_fn` gets them): module globals, closure cells, functions' defaults, class
    attributes; each as (source, guard type, `stand_in` of the value read back as a warm start will read
    it). `Unkeyable` where there are no guards, or a value cannot be read back or stood in for."""
    if guards is None:
        raise Unkeyable("Dynamo reported no guards for the trace")
    reads = []
    for source, guard_type in outside_sources(guards, frame_globals):
        read = f"the trace read {_readable(source)}"
        if any(_named_by_id(found, frame_globals) is not None for found in _BY_ID.finditer(source)):
            raise Unkeyable(f"{read}, a value Dynamo names by its id in this process only")
        try:  # read back as a warm start will (the guard's own value may come from a module imported before)
            value = read_back(source, model, frame_globals)
        except Exception as exc:  # noqa: BLE001 - a source this resolution does not cover
            why = f"{type(exc).__name__}: {exc}"
            raise Unkeyable(f"{read}, which a warm start cannot read back ({why})") from None
        reads.append((source, guard_type, stand_in(value, guard_type, source)))
    return reads


def changed_read(reads: Sequence[tuple], model: Any, frame_globals: dict[str, Any]) -> str | None:
    """Why the first of a record's `outside_reads` differs now (which value, now and in the record), or
    None."""
    for source, guard_type, value in reads:
        try:
            if (now := stand_in(read_back(source, model, frame_globals), guard_type, source)) != value:
                return f"{_readable(source)} is {now!r}, the record's trace read {value!r}"
        # a module gone, an attribute renamed: the record does not apply
        except Exception as exc:  # noqa: BLE001
            return f"{_readable(source)} cannot be read ({type(exc).__name__}: {exc})"
    return None


def save(config: CompilationConfig, key: str, record: Record, facts: dict[str, Any]) -> bool:
    """Store `record` under `key`, the digest of `facts` (`model_facts`); False (logged by the cache) where
    it cannot be written."""
    # the record's own cache folder, whose factors.json holds `facts` (what `load` explains a later miss with)
    cache = core.CompileCache.open(config.resolved_cache_dir(), f"model-{key}", core.as_json(facts))
    data = pickle.dumps(tuple(record), protocol=pickle.HIGHEST_PROTOCOL)

    def write(path: str) -> None:  # `store`'s `save` returns nothing (write_bytes returns a count)
        Path(path).write_bytes(data)

    return cache is not None and cache.store(ENTRY, write)


def _read(path: str) -> Record:
    return Record(*pickle.loads(Path(path).read_bytes()))  # noqa: S301 - see the module doc on trust


def load(config: CompilationConfig, key: str, facts: dict[str, Any]) -> Record | None:
    """The record stored under `key` (the digest of `facts`) whose traced files are unchanged, or None.
    Where there is none but a record of the model's class is stored under another key, the log names the
    first fact that differs from the newest such record's (`key_change`)."""
    # `save`'s cache folder
    cache = core.CompileCache.open(config.resolved_cache_dir(), f"model-{key}", core.as_json(facts))
    record = None if cache is None else cache.load(ENTRY, _read)[0]
    if cache is not None and not os.path.exists(cache.index_path):  # a new key: why, against the class's
        model_class = facts["modules"]["<root>"]["class"]
        same_class = lambda found: found.get("modules", {}).get("<root>", {}).get("class") == model_class  # noqa: E731
        if (change := core.key_change(cache.root, f"model-{key}", facts, same_class)) is not None:
            since = f"the last record of {model_class[1]} was stored: {core.describe_change(change)}"
            log.info("pieceworks: tracing the model: its serving record's key changed since %s", since)
    if record is None or (path := changed_file(record.files)) is None:
        return record
    log.info("pieceworks: %s changed since this model's serving record was stored: tracing the model", path)
    return None
