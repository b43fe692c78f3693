"""A call's arguments: their order, their batch size and their checks against the first call.

`Arguments` puts a call's positional and keyword arguments in one order, the one the compiled model serves:
the first call's positional arguments, then its keyword arguments sorted by name. A later call of the same
form (as many positional arguments, the same keywords, in any order) costs one list; a call of another form is
bound by the model's `forward` signature once per form (`model(ids)` after `model(input_ids=ids)`): a
parameter the first call left to its default must be passed with that default's value (type and value, as any
non-tensor argument), since the trace baked it in.

Every call is checked against the first (`check_arguments`): the same count, dtypes, devices, ranks and
non-batch sizes, and non-tensor arguments of the same type and value; dim 0 of every tensor argument is the
batch (`batch_of`). A mismatch raises `InputError` naming the argument and the fix. Where `forward` branched
on the batch size, every size a call runs at must take the trace's branch (`BatchRule`).
"""

from __future__ import annotations

import inspect
from collections.abc import Collection, Sequence
from typing import Any

import sympy
import torch

# Where a call holds a parameter's value (`Arguments`): a position, a keyword, or the default (plain ints:
# compared per call)
_POSITIONAL, _KEYWORD, _DEFAULT = range(3)


class InputError(ValueError):
    """A call's arguments do not fit what the model was compiled for."""


_FIX = "Fix: pass arguments like the first call's, or compile another CompiledModel"
_PAD = "Fix: pad every size but dim 0 (the batch) to the first call's, or compile another CompiledModel"


class Arguments:
    """The first call's form (`count` positional arguments, then keyword arguments `names`, sorted) of
    `model` (its `forward`'s signature binds other forms); `labels` name each place for messages (its position
    or keyword; None for a form without keywords: positions name them). `flat(args, kwargs)`: a call's
    arguments in that order (an `InputError` naming an argument that does not fit), and `call(fn, flat)`
    calls `fn` with them as the first call was made."""

    def __init__(self, model: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
        self.model, self.count, self.names, self.keys = model, len(args), tuple(sorted(kwargs)), set(kwargs)
        self.labels = [*map(str, range(len(args))), *self.names] if kwargs else None
        self._forms: dict[tuple, tuple[list, list]] = {}

    def flat(self, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any]:
        if len(args) == self.count and kwargs.keys() == self.keys:
            return [*args, *map(kwargs.__getitem__, self.names)]
        if (form := (len(args), tuple(sorted(kwargs)))) not in self._forms:
            self._forms[form] = self.plan(*form)
        sources, extras = self._forms[form]
        for place, where, default, label in extras:
            value = args[where] if place == _POSITIONAL else kwargs[where]
            # another type or value than the default's (a tensor is never the default's `signature`)
            if value is not default and signature(value) != ("value", type(default), default):
                why = f"but the model was compiled with its default {default!r}: the first call left it out"
                raise InputError(f"argument {label} is {value!r:.80}, {why}. {_FIX}")
        return [args[w] if k == _POSITIONAL else (kwargs[w] if k == _KEYWORD else w) for k, w in sources]

    def call(self, fn: Any, flat: Sequence[Any]) -> Any:
        return fn(*flat[: self.count], **dict(zip(self.names, flat[self.count :])))

    def plan(self, count: int, names: tuple[str, ...]) -> tuple[list, list]:
        """Per place of the first call's form, where a call of form (`count`, `names`) has its value (or the
        parameter's default); and the call's arguments the first call left to defaults."""
        sig = inspect.signature(self.model.forward if isinstance(self.model, torch.nn.Module) else self.model)
        called = f"compiled for {_form(self.count, self.names)}, called with {_form(count, names)}"
        # where the first call had each value, and where this call has it
        first, now = _bound(sig, self.count, self.names, called), _bound(sig, count, names, called)
        # `empty`: no default (a required parameter, a `*args` item, a `**kwargs` entry)
        empty = inspect.Parameter.empty
        default = {k: sig.parameters[k].default if isinstance(k, str) else empty for k in first | now}
        missing = [(key, "is missing, but the first call passed it") for key in first if key not in now]
        extra = [(key, "was not passed in the first call") for key in now if key not in first]
        # the first of them without a default: the call cannot be put in the first call's form
        for key, why in [(key, why) for key, why in missing + extra if default[key] is empty]:
            raise InputError(f"{called}: argument {_label(key)} {why}. {_FIX}")
        # the first call's places sort in its flat order: (_POSITIONAL, i) by i, then (_KEYWORD, name) by name
        sources = [now.get(key, (_DEFAULT, default[key])) for key in sorted(first, key=first.__getitem__)]
        return sources, [(*now[key], default[key], _label(key)) for key in now if key not in first]


def _bound(signature: inspect.Signature, count: int, names: Sequence[str], called: str) -> dict[Any, tuple]:
    """Per parameter (a `*args` item by (name, index), a `**kwargs` entry by (name, key)), where a call of
    `count` positional arguments and keywords `names` has its value: (_POSITIONAL, index) or (_KEYWORD,
    name)."""
    try:
        bound = signature.bind(*[(_POSITIONAL, i) for i in range(count)], **{k: (_KEYWORD, k) for k in names})
    except TypeError as exc:
        why = f"{exc}: the model's forward{signature} does not take them"
        raise InputError(f"{called}: {why}. Fix: call the model with arguments its forward takes") from None
    found: dict[Any, tuple] = {}
    for name, value in bound.arguments.items():
        if (kind := signature.parameters[name].kind) is inspect.Parameter.VAR_POSITIONAL:
            found.update({(name, i): v for i, v in enumerate(value)})
        elif kind is inspect.Parameter.VAR_KEYWORD:
            found.update({(name, k): v for k, v in value.items()})
        else:
            found[name] = value
    return found


def _form(count: int, names: Sequence[str]) -> str:
    return f"{count} arguments" + (f" and the keywords {', '.join(names)}" if names else "")


def _label(key: Any) -> str:
    return key if isinstance(key, str) else f"{key[0]}[{key[1]!r}]"


def batch_of(args: Sequence[Any], labels: Sequence[str] | None = None) -> int:
    """The batch size of a call: dim 0 of every tensor argument, which must agree (else `InputError`).
    `labels` name the arguments (default: their positions)."""
    sizes = [a.shape[0] if a.dim() else 0 for a in args if isinstance(a, torch.Tensor)]  # per call: no dict
    if sizes and sizes[0] >= 1 and sizes.count(sizes[0]) == len(sizes):
        return sizes[0]
    tensors = {i: a for i, a in zip(labels or range(len(args)), args) if isinstance(a, torch.Tensor)}
    for i in [i for i, a in tensors.items() if a.dim() == 0]:  # the first 0-d tensor argument
        raise InputError(
            f"argument {i} is a 0-d tensor (shape ()): pieceworks treats dim 0 of every tensor argument as "
            f"the batch dimension. Fix: pass it with a batch dimension: x.expand(batch) or x[None]"
        )
    if not tensors:
        raise InputError("pieceworks needs at least one tensor argument with a batch dimension (dim 0)")
    batches = {i: a.shape[0] for i, a in tensors.items()}
    if len(set(batches.values())) > 1:
        fix = "Fix: every tensor argument must have the same dim 0"
        raise InputError(f"tensor arguments disagree on the batch size (dim 0): {batches}. {fix}")
    raise InputError("batch size 0: pieceworks serves batches of at least 1")  # they agree, on 0


def signature(a: Any) -> tuple:
    """What a later call must repeat: a tensor's dtype, device, rank and trailing sizes; a value's type and
    value (`2 == 2.0 == True` in Python, but the trace baked in the type too)."""
    if isinstance(a, torch.Tensor):
        return (a.dtype, a.device, a.dim(), tuple(a.shape[1:]))
    return ("value", type(a), a)


def check_arguments(args: Sequence[Any], signatures: list[tuple], labels: Sequence[str] | None = None) -> int:
    """The batch size of a call whose arguments match the first call's `signatures`; `InputError` naming the
    argument (by `labels`, default its position), what it is and what was compiled, otherwise."""
    batch = batch_of(args, labels)  # as many arguments as `signatures`: `Arguments.flat` puts them in order
    for i, a, want in zip(labels or range(len(args)), args, signatures):
        if signature(a) != want:
            if want[0] == "value":
                expected = f"the value {want[2]!r} ({want[1].__name__})"
            else:
                expected = f"dtype={want[0]}, device={want[1]}, rank {want[2]}, trailing shape {want[3]}"
            if isinstance(a, torch.Tensor):
                got = f"Tensor(shape={tuple(a.shape)}, dtype={a.dtype}, device={a.device})"
            else:
                got = f"{a!r} ({type(a).__name__})"
            # sizes alone differ (dtype, device, rank alike): padding serves it
            fix = _PAD if isinstance(a, torch.Tensor) and signature(a)[:3] == want[:3] else _FIX
            raise InputError(f"argument {i} is {got}, but the model was compiled for {expected}. {fix}")
    return batch


def refuse_grad(args: Sequence[Any], labels: Sequence[str] | None = None) -> None:
    """`InputError` naming the first tensor argument that requires grad (call while grad mode is on): the
    compiled model serves inference only, so its output could carry no gradient where eager's would."""
    for i, a in zip(labels or range(len(args)), args):
        if isinstance(a, torch.Tensor) and a.requires_grad:
            why = "a compiled model serves inference only: its output would carry no gradient"
            fix = "call it under torch.no_grad() or torch.inference_mode(), or pass the argument's .detach()"
            raise InputError(f"argument {i} requires grad and grad mode is on, but {why}. Fix: {fix}")


def contiguous(args: Sequence[Any]) -> list[Any]:
    """The arguments in the layout pieces are compiled for: contiguous (a copy where an argument is not)."""
    return [a.contiguous() if isinstance(a, torch.Tensor) else a for a in args]


BATCH = sympy.Symbol("batch", integer=True, positive=True)  # the batch size in `batch_guards`


def batch_guards(guards: Sequence[Any], symbols: Collection[str]) -> list[Any]:
    """Of a trace's shape guards (sympy), those over the batch `symbols` alone, as guards on `BATCH`: where
    `forward` branched on the batch size (`batch <= 8`, `Eq(Mod(batch, 2), 0)`). The guard tying every
    argument's dim 0 together becomes `True` and is left out."""
    on_batch = [g for g in guards if {str(s) for s in g.free_symbols} <= set(symbols)]
    on_batch = [g.xreplace(dict.fromkeys(g.free_symbols, BATCH)) for g in on_batch]
    return [g for g in on_batch if g is not sympy.true]


class BatchRule:
    """`check(batch, padded)`: `InputError` where a size a call runs at (its batch, its padded size) fails one
    of the trace's `batch_guards`: eager takes another branch there than the trace took. Once per size."""

    def __init__(self, guards: Sequence[Any]) -> None:
        self.guards, self._met = list(guards), set[int | None]([None])

    def check(self, batch: int, padded: int | None) -> None:
        for size in {batch, padded} - self._met:
            if failed := [str(g) for g in self.guards if not g.subs(BATCH, size)]:
                raise InputError(
                    f"forward branches on the batch size: the trace holds where {', '.join(failed)}, not at "
                    f"{size} (this call: {batch} rows, run at {padded or batch}). Fix: keep forward's "
                    "control flow off the batch size (torch.where, not `if`), or compile one model per branch"
                )
            self._met.add(size)
