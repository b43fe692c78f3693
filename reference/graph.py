"""The stitched, compiled graph that Dynamo calls: splitting ops eager, compiled pieces in between."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch.fx

from .config import CompilationConfig
from .piece import BatchLocator, CompiledPiece
from .split import SplitItem

__all__ = ["PiecewiseGraph"]


class PiecewiseGraph:
    """The callable a `Backend` returns for one Dynamo graph.

    `split_gm` is the stitching module; each compiled submodule has been replaced by its `CompiledPiece`
    (`pieces`, by submodule name); splitting submodules are untouched and run eagerly. `cache_dir` is the compile
    cache folder used, or None.
    """

    def __init__(
        self,
        split_gm: torch.fx.GraphModule,
        items: Sequence[SplitItem],
        pieces: dict[str, CompiledPiece],
        locate_batch: BatchLocator,
        config: CompilationConfig,
        cache_dir: str | None = None,
    ) -> None:
        self.split_gm = split_gm
        self.cache_dir = cache_dir
        self.items = list(items)
        self.pieces = pieces
        self.locate_batch = locate_batch
        self.config = config
        for name, piece in pieces.items():
            delattr(split_gm, name)  # a plain callable attribute may not shadow a registered submodule
            setattr(split_gm, name, piece)

    def __call__(self, *args: Any) -> Any:
        return self.split_gm(*args)
