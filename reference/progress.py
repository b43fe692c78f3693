"""Progress bars for the phases that take seconds to minutes: compiling the pieces, capturing the sizes.

A tqdm bar on stderr while it is a terminal; nothing when stderr is not a terminal (logs, CI), when
`PIECEWORKS_PROGRESS` is off (0, false, no, off: `config.env_flag`), or when tqdm is not installed. The bar is
removed when the phase ends; the phase's one INFO summary line stays (logging).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable
from typing import TypeVar

from .config import env_flag

T = TypeVar("T")


def shown() -> bool:
    """Whether bars are drawn: `PIECEWORKS_PROGRESS` is not off and stderr is a terminal."""
    return env_flag("PIECEWORKS_PROGRESS", True) and sys.stderr.isatty()


def progress(items: Iterable[T], description: str) -> Iterable[T]:
    """`items`, shown as a bar named `description` where the module doc says."""
    if shown():
        with contextlib.suppress(ImportError):  # no tqdm: no bar
            from tqdm import tqdm

            return tqdm(items, desc=f"pieceworks: {description}", leave=False, file=sys.stderr)
    return items
