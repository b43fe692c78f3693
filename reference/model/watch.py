"""What a compiled model watches of its model after the first call, and how, at a few reads per call.

The trace read the model as it was at the first call: its parameters and buffers (bound by object, read where
they live) and the rest of its Python state, baked into the graph (`self.scale`, `norm.eps`, `self.training`,
the forward hooks it ran). Every change to that state is seen when it happens, by an event; a call reads one
flag (`StateWatch.changed`), torch's count of hook handles (`handles`) and the global modes (`stale()`):

- a parameter, buffer or submodule replaced (setattr, `load_state_dict(assign=True)`, a new submodule), or a
  parameter or buffer reallocated (`.to()`, `.cuda()`, `.half()`): `replaced`, and the call raises
  `StateReplacedError` (the graphs still read the old memory). Seen by torch's process-wide registration hooks
  and the watched class's `_apply`;
- a submodule, parameter or buffer added to a watched module (`ModuleList.append`, which bypasses
  `setattr`): `changed`, seen by the same registration hooks;
- any other attribute of a watched module set to another value or deleted (`model.scale = 3.0`, `norm.eps =
  10.0`, `layer.heads = 2`, `model.train()` on a model traced in eval mode, `module.forward = f`; torch's
  parametrize, which deletes a parameter and swaps the class), a forward hook or pre-hook registered on one, a
  hook the trace ran removed, or a watched tensor's memory freed (`p.data = t`, where no other tensor holds
  the old memory; seen by a finalizer on its storage): `changed`, and the next call traces and compiles the
  model again (compiled_model.py; one WARNING naming what changed). Writes that `forward` itself makes, on
  calls that go through Dynamo, are its own (`paused`), and so are the markers `torch.compile(model)` and
  `model.compile()` set (`_TORCH_MARKERS`). Seen by the watched class (`__setattr__`, `__delattr__`,
  `register_forward_hook`, `register_forward_pre_hook`) and, for the hooks the trace ran, by a stand-in in the
  module's hook table that calls the hook and flags the change once torch's handle removes it
  (`_HookStandIn`);
- the process-wide modes a trace bakes in (`global_modes`: the default dtype, CPU and CUDA autocast and their
  dtypes, deterministic algorithms), each watched module's class's `forward` (`Layer.forward = f`) and the
  attributes of modules, classes and closure cells the trace read outside the model (`record.watched_reads`:
  a module global, a class attribute, a captured value; each value and its type), which no event
  announces: read per call (`now()`, a few microseconds), and a change is `changed` as above (a later call
  is traced for it, never served the first call's);
- a global module forward hook (`register_module_forward_hook`, `register_module_forward_pre_hook`): it runs
  on every nn.Module, the compiled model's own graph modules included, so no compiled model can give eager's
  result while one is registered: `GlobalHookError` at any call (the first one included) until it is removed.
  Seen when torch's count of hook handles moved (`handles`; registering any hook moves it), then checked once.

Watched modules are those of `model.named_modules()` at the trace. A watched module's class is swapped for a
subclass of its class made once per class (the same name, module and qualname; `isinstance` holds, `type(m) is
Linear` does not while watched, `m.__class__` is the original class, as torch's parametrize edits and sets it;
pickling and deep copies give the original class), and swapped back when no compiled model watches the module
anymore.

Not watched, since nothing announces them: changes inside an attribute's value (`model.cfg.eps = 1.0` on a
config object, `model.sizes.append(8)`), writes that bypass `setattr` (`module.__dict__[...]`,
`object.__setattr__`, `p.data = t` while another tensor holds the old memory), and environment variables
`forward` reads (in one process they stay as the trace saw them; a model that reads one gets no serving
record: record.py). Compile the model again after changing those.
"""

from __future__ import annotations

import copyreg
import functools
import operator
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from . import _compat

_ABSENT = object()
_PLAIN = (bool, int, float, str, bytes, torch.device)
_HOOK_TABLES = {"_forward_hooks": "forward hook", "_forward_pre_hooks": "forward pre-hook"}
# What torch.compile(module) and module.compile() set on the module: markers that leave forward's result as it
# was
_TORCH_MARKERS = frozenset({"_is_torch_compile", "_compiled_call_impl"})


class StateReplacedError(RuntimeError):
    """A parameter or buffer of a compiled model was replaced or reallocated after compiling."""


class GlobalHookError(RuntimeError):
    """A global module forward hook is registered: no compiled model can give the eager model's result."""


def refuse_global_hooks() -> None:
    """`GlobalHookError` naming the fix while a global module forward hook or pre-hook is registered."""
    if _compat.global_module_hooks():
        raise GlobalHookError(
            "pieceworks: a global module forward hook is registered (torch.nn.modules.module."
            "register_module_forward_hook or register_module_forward_pre_hook); it runs on every nn.Module, "
            "the compiled model's own graph modules included, so the compiled model cannot give the eager "
            "result. Fix: remove it (handle.remove()), or register the hook on the model's modules "
            "(module.register_forward_hook)"
        )


# what `global_modes` reads, by name
MODES: tuple[str, ...] = ("the default dtype", "CPU autocast", "CPU autocast dtype", "CUDA autocast")
MODES += ("CUDA autocast dtype", "determinism", "torch function modes (torch.device, set_default_device)")


def global_modes() -> tuple:
    """The process-wide modes a trace bakes in (`MODES`), read in under a microsecond."""
    enabled, dtype = torch.is_autocast_enabled, torch.get_autocast_dtype
    cpu, cuda = (enabled("cpu"), dtype("cpu")), (enabled("cuda"), dtype("cuda"))
    deterministic = torch.are_deterministic_algorithms_enabled()
    return torch.get_default_dtype(), *cpu, *cuda, deterministic, _compat.modes()


# the live watches; the process-wide hooks and the watched classes call each
_WATCHES: set[StateWatch] = set()


def _tell(event: Callable[..., None], module: torch.nn.Module, *args: Any) -> None:
    """`event` (`StateWatch.note` or `StateWatch.check`) of every live watch, about `module`."""
    for watch in list(_WATCHES):
        event(watch, module, *args)


def _replaced(module: torch.nn.Module, name: str, value: Any) -> None:
    """A registration hook: `value` is about to become `module.name` (any module of the process). Not
    traced: in a forward Dynamo traces (a buffer assigned), it would guard on the live watches, which come
    and go with models."""
    if not torch.compiler.is_dynamo_compiling():
        _tell(StateWatch.check, module, [(name, value)], "replaced")


@functools.cache
def _register_hooks_once() -> None:
    """One registration hook of each type (parameter, buffer, submodule) for the whole process, never removed:
    Dynamo guards on torch's dicts of global hooks, and a hook removed while another model was being traced (a
    compiled model collected) broke that trace's guards."""
    for kind in ("parameter", "buffer", "module"):
        getattr(torch.nn.modules.module, f"register_module_{kind}_registration_hook")(_replaced)


def _same(old: Any, new: Any) -> bool:
    return old is new or (type(old) is type(new) and isinstance(new, _PLAIN) and old == new)


class _HookStandIn(functools.partial):
    """A hook the trace ran, in its module's hook table: calls the hook (`func`, bound to no arguments);
    when torch's handle removes it from the table (its one reference), a finalizer notes the change. Pickled
    and copied as the hook itself."""

    def __reduce__(self) -> tuple:
        return operator.getitem, ([self.func], 0)  # unpickled: [hook][0]


@functools.cache
def _watched_class(cls: Any) -> type:  # Any: mypy reads `cls.__setattr__` as the metaclass's
    """The subclass a watched module of class `cls` gets: it tells the live watches about attribute writes,
    hook registrations and `_apply` (`.to()` and the like), and pickles as `cls`."""

    # what `name` holds (a parameter, buffer or submodule set to None too)
    def plain(self: Any, name: str) -> Any:
        tables = (self.__dict__, self._parameters, self._buffers, self._modules)
        return type(self) if name == "__class__" else next((t[name] for t in tables if name in t), _ABSENT)

    class Watched(cls):  # of `cls`'s own metaclass
        __module__, __qualname__ = cls.__module__, cls.__qualname__
        _pieceworks_watches = cls

        def register_forward_hook(self, *args: Any, **kwargs: Any) -> Any:
            _tell(StateWatch.note, self, "a forward hook was registered on")
            return cls.register_forward_hook(self, *args, **kwargs)

        def register_forward_pre_hook(self, *args: Any, **kwargs: Any) -> Any:
            _tell(StateWatch.note, self, "a forward pre-hook was registered on")
            return cls.register_forward_pre_hook(self, *args, **kwargs)

        def __setattr__(self, name: str, value: Any) -> None:
            old = plain(self, name)
            cls.__setattr__(self, name, value)
            if not _same(old, plain(self, name)) and name not in _TORCH_MARKERS:
                _tell(StateWatch.note, self, "set", name)

        def __delattr__(self, name: str) -> None:  # `del`, and torch's parametrize removing a parameter
            cls.__delattr__(self, name)
            _tell(StateWatch.note, self, "deleted", name)

        def _apply(self, *args: Any, **kwargs: Any) -> Any:
            result = cls._apply(self, *args, **kwargs)
            _tell(StateWatch.check, self, _attributes(self), "reallocated (.to(), .cuda(), .half(), ...)")
            return result

        # what `module.__class__` reads and sets (torch's parametrize edits the class it reads, then sets
        # another: a change like any attribute set), `type(module)` staying the watched class
        __class__ = property(lambda self: cls, object.__dict__["__class__"].__set__)

        # pickle's __newobj__ insists on the object's own class (typeshed's copyreg lacks these private names)
        def __reduce_ex__(self, protocol: Any) -> Any:
            rebuild, args, *rest = cls.__reduce_ex__(self, protocol)
            if rebuild is copyreg.__newobj__ and len(args) == 1:  # type: ignore[attr-defined]
                rebuild, args = copyreg._reconstructor, (cls, object, None)  # type: ignore[attr-defined]
            return (rebuild, tuple(cls if a is Watched else a for a in args), *rest)

    Watched.__name__ = cls.__name__
    return Watched


def original_class(cls: type) -> type:
    """`cls`, or the class a watched class stands in for."""
    return cls.__dict__.get("_pieceworks_watches", cls)


class StateWatch:
    """`replaced`: None, or why the model must be compiled again (a parameter, buffer or submodule replaced
    or reallocated since the watch began). `changed`: None, or the first change to the rest of the model's
    state (or `replaced`). `handles`: torch's count of hook handles when the watch began or last found no
    global hook. Events update them (see the module doc); reading them is all a call costs. `close()` ends
    the watch."""

    def __init__(self, model: torch.nn.Module, owner: object, reads: Sequence[tuple] = ()) -> None:
        self.replaced: str | None = None
        self.changed: str | None = None
        # while the compiled model itself runs forward through Dynamo (its writes are its own)
        self.paused = False
        # Per module id: its name and the module (kept alive, so that the ids stay theirs); per (module id,
        # attribute name): the full name, the object there and, for a tensor, where its memory lives.
        self._paths = {id(module): (prefix, module) for prefix, module in model.named_modules()}
        self._watched: dict[tuple[int, str], tuple[str, Any, tuple | None]] = {}
        # What `close()` detaches: (hook table, key, finalizer) of each hook stand-in (the table holds it),
        # and ({}, None, finalizer) of each watched tensor's memory (`.data = t` frees it: no setattr is made)
        self._finalizers: list[tuple[dict, Any, weakref.finalize[..., Any]]] = []
        for path, module in self._paths.values():
            for name, value in _attributes(module):
                self._watched[id(module), name] = (f"{path}.{name}" if path else name, value, _place(value))
                if type(value) in (torch.Tensor, torch.nn.Parameter):  # `.data = t` frees the old memory
                    note = functools.partial(self.note, module, "given other memory (.data =)", name)
                    self._finalizers.append(({}, None, weakref.finalize(value.untyped_storage(), note)))
            module.__class__ = _watched_class(original_class(type(module)))
            for table_name, what in _HOOK_TABLES.items():  # each hook the trace ran: a stand-in in its place
                table, why = getattr(module, table_name), f"a {what} the trace ran was removed from"
                for key, hook in list(table.items()):
                    table[key] = stand_in = _HookStandIn(hook)
                    self._finalizers.append((table, key, weakref.finalize(stand_in, self.note, module, why)))
        _register_hooks_once()
        # each watched class's forward, and the attributes the trace read outside the model
        # (record.watched_reads): (name, the object read from, the attribute)
        classes = {original_class(type(m)): None for _, m in self._paths.values()}
        self._reads = [(f"{cls.__qualname__}.forward", cls, "forward") for cls in classes] + [*reads]
        self.handles, self.modes = _compat.HookHandle.next_id, self.now()
        _WATCHES.add(self)
        weakref.finalize(owner, self.close)

    def now(self) -> tuple:
        """What no event announces, read per call: the global modes, each watched class's `forward` and the
        attributes the trace read outside the model."""
        values = [getattr(held, name, _ABSENT) for _, held, name in self._reads]
        return *global_modes(), *values, *map(type, values)  # 2 == 2.0, but not to a trace

    def stale(self) -> bool:
        """Whether the next call must look closer (`changed`, hook handles moved); notes a change of now()."""
        if self.changed is None and (now := self.now()) != self.modes:
            labels = [label for label, _, _ in self._reads]
            names = (*MODES, *labels, *(f"the type of {label}" for label in labels))
            self.changed = next(f"{n} was {a}, is {b}" for n, a, b in zip(names, self.modes, now) if a != b)
        return self.changed is not None or self.handles != _compat.HookHandle.next_id

    def __enter__(self) -> None:
        """`with watch:` pauses it: the compiled model itself runs forward through Dynamo."""
        self.paused = True

    def __exit__(self, *exc: Any) -> None:
        self.paused = False

    def note(self, module: torch.nn.Module, what: str, attribute: str | None = None) -> None:
        """Note that `module`'s `attribute` was `what` ("set", "deleted"), or without `attribute`, that
        `what` ("a forward hook was registered on") happened to `module`; if the watch covers it and noted
        nothing yet."""
        path = self._paths.get(id(module), (None,))[0]
        if path is not None and self.changed is None and not self.paused:
            named = f"{path}.{attribute}" if path else attribute
            self.changed = f"{what} {path or 'the model'}" if attribute is None else f"{named} was {what}"

    def check(self, module: torch.nn.Module, attributes: Sequence[tuple[str, Any]], how: str) -> None:
        """Flag the first of `module`'s watched `attributes` that is not the object watched there, or not
        where it was; note one of a watched module that is new (added). An attribute not watched (another
        module's, a deep copy's) is never read: it may be a fake tensor."""
        for name, value in attributes:
            full, old, place = self._watched.get((id(module), name), (None, None, None))
            if full is None:  # a new submodule, parameter or buffer (`ModuleList.append`) of a watched module
                self.note(module, "added", name)
            elif self.replaced is None and (old is not value or _place(value) != place):
                self.replaced = self.changed = (
                    f"{full} of the compiled model was {how} after its first call; its compiled graphs still "
                    "read the old tensor. Fix: load new values in place (model.load_state_dict(state) "
                    "without assign=True, or `with torch.no_grad(): param.copy_(new)`), or compile the model "
                    "again with pieceworks.compile"
                )

    def close(self) -> None:
        """End the watch: the hooks the trace ran go back in their tables, and modules no other watch
        covers get their own class back."""
        _WATCHES.discard(self)
        for table, key, gone in self._finalizers:  # detach(): (the object, ...) while it lives, else None
            if (alive := gone.detach()) is not None and table.get(key) is alive[0]:  # a hook's stand-in
                table[key] = table[key].func
        for i in self._paths.keys() - {other for watch in _WATCHES for other in watch._paths}:
            self._paths[i][1].__class__ = original_class(type(self._paths[i][1]))
        self._finalizers, self._paths = [], {}


def _attributes(module: torch.nn.Module) -> tuple[tuple[str, Any], ...]:
    """A module's own parameters, buffers (each under every name it has) and submodules."""
    parameters = module.named_parameters(recurse=False, remove_duplicate=False)
    buffers = module.named_buffers(recurse=False, remove_duplicate=False)
    return (*parameters, *buffers, *module.named_children())


def _place(value: Any) -> tuple | None:
    return (value.data_ptr(), value.dtype, value.device) if isinstance(value, torch.Tensor) else None
