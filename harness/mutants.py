"""Deliberately broken variants of the reference, to show that each property catches a real bug.

`pytest suites/test_properties.py --pieceworks-mutant NAME` applies mutant NAME before the suites import
pieceworks; the property it targets must then fail, and hypothesis shows the shrunk example. Never used otherwise.
See results/property_mutants.md for what each run printed.
"""

from __future__ import annotations

import bisect
import os
from collections.abc import Callable

import pytest

__all__ = ["MUTANTS", "apply"]


def _split_loses_order(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.split as split

    original = split.split_module
    mp.setattr(split, "split_module", lambda *a, **k: original(*a, **{**k, "keep_original_order": False}))


def _getitem_to_next_piece(mp: pytest.MonkeyPatch) -> None:
    import operator

    import pieceworks.split as split

    original = split._assign_pieces

    def assign(gm, ops):
        piece_of, splitting = original(gm, ops)
        for node in piece_of:
            if node.target is operator.getitem and piece_of[node] in splitting:
                piece_of[node] += 1
        return piece_of, splitting

    mp.setattr(split, "_assign_pieces", assign)


def _index_without_checksum(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.cache as cache

    mp.setattr(cache, "_entries_digest", lambda entries: "unchecked")


def _key_ignores_config(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.compiler as compiler

    original = compiler.cache_factors

    def factors(gm, fakes, config):
        found = original(gm, fakes, config)
        found.pop("config")
        return found

    mp.setattr(compiler, "cache_factors", factors)


def _pad_to_the_size_below(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.dispatch as dispatch
    import pieceworks.runtime as runtime

    def padded(sizes, batch):
        i = bisect.bisect_right(sizes, batch)
        return sizes[i - 1] if i > 0 and sizes[i - 1] >= batch else (sizes[i] if i < len(sizes) else None)

    def wrong(sizes, batch):  # one size too far: correct only when the batch is exactly a captured size
        i = bisect.bisect_left(sizes, batch)
        return sizes[i] if i < len(sizes) and sizes[i] == batch else (sizes[i - 1] if i > 0 else padded(sizes, batch))

    mp.setattr(dispatch, "padded_size", wrong)
    mp.setattr(runtime, "padded_size", wrong)


def _static_copy_misses_last_row(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.padding as padding

    def load(self, args, batch, n):
        for buffer, a in zip(self.buffers, args):
            if hasattr(a, "shape") and batch > 1:
                buffer[: batch - 1].copy_(a[: batch - 1])
        return self.views(n)

    mp.setattr(padding.StaticInputs, "load", load)


def _load_without_checking(mp: pytest.MonkeyPatch) -> None:
    import pieceworks.cache as cache

    def load(self, name, loader):
        entry = self.read_index().get(name)
        if entry is None:
            return None
        path = os.path.join(self.artifact_dir, entry["file"])
        try:
            return loader(path)
        except Exception:  # noqa: BLE001
            return None

    mp.setattr(cache.CompileCache, "load", load)


MUTANTS: dict[str, tuple[str, Callable[[pytest.MonkeyPatch], None]]] = {
    "split_loses_order": ("split_module without keep_original_order (properties 1, 2)", _split_loses_order),
    "getitem_to_next_piece": ("getitems of a splitting op go to the next piece (property 2)", _getitem_to_next_piece),
    "index_without_checksum": ("the index's SHA-256 is not checked (property 3)", _index_without_checksum),
    "key_ignores_config": ("the cache key leaves out the config (property 4)", _key_ignores_config),
    "pad_to_the_size_below": ("padding picks the captured size below the batch (properties 5, 6)",
                              _pad_to_the_size_below),
    "static_copy_misses_last_row": ("the last real row is not copied into the static buffer (property 6)",
                                    _static_copy_misses_last_row),
    "load_without_checking": ("artifacts load without their SHA-256 check (properties 3, 7)", _load_without_checking),
}


def apply(name: str, mp: pytest.MonkeyPatch) -> str:
    if name not in MUTANTS:
        raise pytest.UsageError(f"unknown mutant {name!r}; known: {sorted(MUTANTS)}")
    description, mutate = MUTANTS[name]
    mutate(mp)
    return description
