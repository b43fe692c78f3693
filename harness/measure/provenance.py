"""Which code a measurement measured: the commit, for result files written outside asv (which records its
own)."""

from __future__ import annotations

import os
import subprocess

__all__ = ["code_commit"]


def code_commit() -> str | None:
    """The measured code's commit, short: $PIECEWORKS_COMMIT (an exported tree), else this checkout's HEAD
    with "-dirty" when it has uncommitted changes, else None (no git, or this file is not in the checkout git
    sees)."""
    commit = os.environ.get("PIECEWORKS_COMMIT")
    if commit:
        return commit[:7]
    here = os.path.dirname(os.path.abspath(__file__))
    try:
        top = subprocess.run(
            ["git", "rev-parse", "--show-toplevel"], capture_output=True, text=True, timeout=10, cwd=here
        ).stdout.strip()
        if not top or not os.path.exists(os.path.join(top, "harness", os.path.basename(__file__))):
            return None
        return (
            subprocess.run(
                ["git", "describe", "--always", "--dirty", "--abbrev=7"],
                capture_output=True,
                text=True,
                timeout=10,
                cwd=top,
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        return None
