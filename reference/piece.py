"""A compiled piece at run time: find the batch size in the arguments, call the code compiled for it.

`CompiledPiece` replaces one non-splitting submodule of the stitching module. Its per-call cost is one attribute
read for the batch size and one dict lookup (the range search runs once per new size and is memoised).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from .dispatch import compile_target

__all__ = ["BatchLocator", "CompiledPiece"]


class BatchLocator:
    """Where the batch size sits in a piece's (or graph's) positional arguments.

    Built from the FakeTensors/SymInts of the trace: the first SymInt argument that is a batch symbol, else the
    first tensor dimension that is exactly a batch symbol. `index is None` means the piece does not depend on the
    batch size at all.
    """

    def __init__(self, example_args: Sequence[Any], batch_symbols: set[str]) -> None:
        self.symbols = set(batch_symbols)
        self.index: int | None = None
        self.dim: int | None = None  # None: the argument is the size itself
        for i, value in enumerate(example_args):
            if isinstance(value, torch.SymInt) and str(value) in batch_symbols:
                self.index = i
                return
        for i, value in enumerate(example_args):
            if isinstance(value, torch.Tensor):
                for d, size in enumerate(value.shape):
                    if isinstance(size, torch.SymInt) and str(size) in batch_symbols:
                        self.index, self.dim = i, d
                        return

    def __call__(self, args: Sequence[Any]) -> int | None:
        if self.index is None:
            return None
        value = args[self.index]
        return int(value) if self.dim is None else value.shape[self.dim]


class CompiledPiece:
    """Compiled code of one piece for each compile range and compile size, dispatched per call.

    `runnables` maps a compile target (an int compile size or a `(lo, hi)` range) to a callable. Thread-safety:
    the memo dict is only ever added to; concurrent callers at worst resolve a size twice.
    """

    def __init__(
        self,
        name: str,
        locate_batch: BatchLocator,
        runnables: dict[int | tuple[int, int], Callable[..., Any]],
        compile_sizes: Sequence[int],
        ranges: Sequence[tuple[int, int]],
    ) -> None:
        self.name = name
        self.locate_batch = locate_batch
        self.runnables = runnables
        self.compile_sizes = list(compile_sizes)
        self.ranges = list(ranges)
        self._by_batch: dict[int | None, Callable[..., Any]] = {}
        if locate_batch.index is None:
            self._by_batch[None] = runnables[self.ranges[0]]

    def runnable_for(self, batch: int | None) -> Callable[..., Any]:
        fn = self._by_batch.get(batch)
        if fn is None:
            fn = self.runnables[compile_target(self.compile_sizes, self.ranges, batch)]
            self._by_batch[batch] = fn
        return fn

    def __call__(self, *args: Any) -> Any:
        return self.runnable_for(self.locate_batch(args))(*args)

    def __repr__(self) -> str:
        return f"CompiledPiece({self.name}, targets={list(self.runnables)})"
