"""Progress bars for the phases that take seconds to minutes: compiling the pieces, capturing the sizes.

A tqdm bar on stderr while it is a terminal; nothing when stderr is not a terminal (logs, CI), when
`PIECEWORKS_PROGRESS=0`, or when tqdm is not installed. The bar is removed when the phase ends; the phase's one
INFO summary line stays (logging).
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")


def progress(items: Iterable[T], description: str, total: int | None = None) -> Iterable[T]:
    """`items`, shown as a bar named `description` where the module doc says."""
    if os.environ.get("PIECEWORKS_PROGRESS", "1") != "0" and sys.stderr.isatty():
        with contextlib.suppress(ImportError):  # no tqdm: no bar
            from tqdm import tqdm

            return tqdm(items, desc=f"pieceworks: {description}", total=total, leave=False, file=sys.stderr)
    return items
