"""The run a conformance session makes, read from its options once, before collection: device, subjects and
plan.

`resolve(config)` (the plugin calls it when collection starts; later calls return the same run) raises one
`pytest.UsageError` naming the option at fault and the fix. The seed is `--hypothesis-seed` where given
(hypothesis' own option, so a run is replayed with the seed it printed), 0 under a derandomized hypothesis
profile (the `ci` profile), else a new one per run. The capture sizes are drawn from it (`plan.Plan.draw`) up
to `--conformance-max-size`, at most `--conformance-sizes` of them.
"""

from __future__ import annotations

import dataclasses
import secrets

import pytest
import torch
from hypothesis import settings

from .plan import Plan
from .subjects import Subject, select

__all__ = ["Run", "resolve"]

_RUN = pytest.StashKey["Run"]()


@dataclasses.dataclass(frozen=True)
class Run:
    device: str  # "cuda" or "cpu"
    subjects: list[Subject]
    plan: Plan


def _device(config: pytest.Config) -> str:
    device = config.getoption("--conformance-device")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise pytest.UsageError(
            f"pieceworks conformance: --conformance-device cuda, but torch {torch.__version__} "
            "sees no CUDA device here: leave the option out (auto) or pass "
            "--conformance-device cpu to run the properties that need no CUDA graph"
        )
    return device


def _seed(config: pytest.Config) -> int:
    given = config.getoption("--hypothesis-seed", default=None)
    if given is None:
        assert settings.default is not None  # hypothesis loads its default profile when imported
        return 0 if settings.default.derandomize else secrets.randbelow(2**32)
    try:
        return int(given)
    except ValueError:
        raise pytest.UsageError(
            f"pieceworks conformance: --hypothesis-seed {given!r} is not an integer; the "
            "conformance suite draws its capture sizes from an integer seed. Fix: pass the "
            "number a run printed (its 'seed N')"
        ) from None


def resolve(config: pytest.Config) -> Run:
    """The run of `config`'s options, resolved once; one UsageError for the first option at fault."""
    if _RUN not in config.stash:
        device = _device(config)
        max_size, count = config.getoption("--conformance-max-size"), config.getoption("--conformance-sizes")
        if max_size < 1 or count < 1:
            raise pytest.UsageError(
                f"pieceworks conformance: --conformance-max-size {max_size} and "
                f"--conformance-sizes {count} must both be at least 1"
            )
        try:
            subjects = select(config.getoption("--impl"), config.getoption("--conformance-model"))
        except (KeyError, ImportError, AttributeError, TypeError, ValueError) as exc:
            message = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
            raise pytest.UsageError(f"pieceworks conformance: {message}") from None
        config.stash[_RUN] = Run(device, subjects, Plan.draw(_seed(config), max_size, count))
    return config.stash[_RUN]
