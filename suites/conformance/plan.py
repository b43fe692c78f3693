"""What a conformance run serves: its seed, the capture sizes drawn for it, and the batch sequences of each
property.

- `Plan.draw(seed, max_size, max_count)`: capture sizes drawn by hypothesis under `@seed(seed)` (the same
  seed, the same sizes): the largest between min(8, max_size) and max_size, and 1 to max_count - 1 more below
  it.
- `Plan.sweep`: every batch from 1 to the largest capture size + 2 ascending, then the `far` batches (2 x the
  largest + 1, and at least `FAR_BATCH`: served without CUDA graphs), each capture size served twice in a row,
  largest first, then every batch descending (above `SWEEP_EVERY_BATCH`: 1, 2, each capture size and its
  neighbours, the largest + 2). Every property that serves sequences serves the sweep first, so a runtime
  wrong at any one batch size up to just above the largest, or far above it, fails whatever the draw. A
  model's `max_batch` caps the far batches (the `plan` fixture sets it per subject).
- `Plan.sequences()`: hypothesis' batch sequences up to a quarter above the largest size (at least 2 above):
  random, ascending, descending, repeated, rich in capture sizes and their neighbours.
- `serve(plan, step, name)`: `step(i, batch)` (one call and its checks) over the sweep, then over drawn
  sequences under `@seed(plan.seed)`, a fifth of the loaded hypothesis profile's examples (at least 3), shrunk
  on failure. A failing call's AssertionError starts with the batches served up to it: `batches [1, 2, 3]:
  call 2 (batch 3): ...`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, Phase, example, given, seed, settings
from hypothesis import strategies as st

__all__ = ["Plan", "serve", "DEFAULT_MAX_SIZE", "DEFAULT_MAX_COUNT", "FAR_BATCH"]

DEFAULT_MAX_SIZE = 12  # a sweep of 1..14 per property keeps the default CPU run short; widen for nightly runs
DEFAULT_MAX_COUNT = 4
SWEEP_EVERY_BATCH = (
    64  # sweeps up to this batch serve every batch; larger ones each capture size and its neighbours
)
FAR_BATCH = 129  # the sweep reaches at least this batch, past the largest capture size (`Plan.far`)
_QUIET: dict[str, Any] = dict(
    database=None,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.large_base_example,
    ],
)


def _capture_sizes(max_size: int, max_count: int) -> st.SearchStrategy[list[int]]:
    def below(top: int) -> st.SearchStrategy[list[int]]:
        more = min(max_count, top) - 1  # at least one more size below the largest where there is room for it
        if more == 0:
            return st.just([top])
        rest = st.lists(st.integers(1, top - 1), min_size=1, max_size=more, unique=True)
        return rest.map(lambda sizes: sorted({*sizes, top}))

    return st.integers(min(8, max_size), max_size).flatmap(below)


def _draw(strategy: st.SearchStrategy, value_seed: int):
    """One value of `strategy`, the same for the same seed: the last of the few examples hypothesis generates
    under `@seed(value_seed)` (its first is always the simplest)."""
    drawn = []

    @seed(value_seed)
    @settings(max_examples=5, phases=[Phase.generate], derandomize=False, **_QUIET)
    @given(strategy)
    def draw(value):
        drawn.append(value)

    draw()
    return drawn[-1]


@dataclasses.dataclass(frozen=True)
class Plan:
    """A run's seed and capture sizes (ascending), and what it serves with them."""

    seed: int
    capture_sizes: tuple[int, ...]
    max_batch: int | None = None  # the largest batch the subject's model serves: caps `far`

    @classmethod
    def draw(
        cls, plan_seed: int, max_size: int = DEFAULT_MAX_SIZE, max_count: int = DEFAULT_MAX_COUNT
    ) -> Plan:
        if max_size < 1 or max_count < 1:
            raise ValueError(
                f"capture sizes need a largest size and a count of at least 1, not {max_size} and {max_count}"
            )
        return cls(plan_seed, tuple(_draw(_capture_sizes(max_size, max_count), plan_seed)))

    @property
    def largest_batch(self) -> int:
        """The largest batch the run serves: the largest capture size plus a quarter of it (at least 2)."""
        top = max(self.capture_sizes)
        return top + max(2, top // 4)

    @property
    def far(self) -> list[int]:
        """Batches far above the largest capture size: 2 x it + 1, and at least `FAR_BATCH`; none above
        `max_batch`."""
        top, cap = max(self.capture_sizes), self.max_batch or float("inf")
        return sorted({b for b in (2 * top + 1, max(FAR_BATCH, 4 * top + 1)) if top + 2 < b <= cap})

    @property
    def sweep(self) -> list[int]:
        top = max(self.capture_sizes)
        if top + 2 <= SWEEP_EVERY_BATCH:
            up = list(range(1, top + 3))
        else:  # large sizes: the boundaries only
            up = sorted(
                {1, 2, *(b for s in self.capture_sizes for b in (s - 1, s, s + 1) if b >= 1), top + 2}
            )
        up += self.far
        return up + [size for size in sorted(self.capture_sizes, reverse=True) for _ in (0, 1)] + up[::-1]

    @property
    def batches(self) -> list[int]:
        """Every batch size the sweep serves, ascending."""
        return sorted(set(self.sweep))

    def sequences(self, max_len: int = 8) -> st.SearchStrategy[list[int]]:
        sizes = sorted(self.capture_sizes)
        near = sorted({b for s in sizes for b in (s - 1, s, s + 1) if 1 <= b <= self.largest_batch})
        batch = st.one_of(st.sampled_from(sizes), st.sampled_from(near), st.integers(1, self.largest_batch))
        plain = st.lists(batch, min_size=1, max_size=max_len)
        return st.one_of(
            plain,
            plain.map(sorted),
            plain.map(lambda s: sorted(s, reverse=True)),
            st.tuples(batch, st.integers(2, 4)).map(lambda t: [t[0]] * t[1]),
        )

    @property
    def examples(self) -> int:
        """Drawn sequences per property and subject: a fifth of the loaded hypothesis profile's examples, at
        least 3."""
        assert settings.default is not None  # hypothesis loads its default profile when imported
        return max(3, settings.default.max_examples // 5)

    def describe(self) -> str:
        return (
            f"seed {self.seed} (replay: --hypothesis-seed {self.seed}), capture sizes "
            f"{list(self.capture_sizes)}, sweep of batches {_ranges(self.batches)}, then {self.examples} "
            f"drawn sequences per property up to batch {self.largest_batch}"
        )


def _ranges(batches: list[int]) -> str:
    """`1..14` for a run of consecutive batches, else the list."""
    consecutive = batches == list(range(batches[0], batches[-1] + 1))
    return f"{batches[0]}..{batches[-1]}" if consecutive and len(batches) > 2 else str(batches)


def _served(step: Callable[[int, int], None], sequence: list[int]) -> None:
    """Every call of `sequence`; a failing call's AssertionError is prefixed with the batches served up to
    it."""
    for i, batch in enumerate(sequence):
        try:
            step(i, batch)
        except AssertionError as exc:
            exc.args = (f"batches {sequence[: i + 1]}: call {i} (batch {batch}): {exc}", *exc.args[1:])
            raise


def serve(plan: Plan, step: Callable[[int, int], None], name: str, sweep: list[int] | None = None) -> None:
    """`step(i, batch)` for every call of `sweep` (default: the plan's), then of `plan.examples` sequences
    drawn from `plan.sequences()` under `@seed(plan.seed)`, reported under `name` (the property's test)."""

    def run(sequence: list[int]) -> None:
        _served(step, sequence)

    run.__name__ = run.__qualname__ = name
    test = given(sequence=plan.sequences())(run)
    test = settings(settings.default, max_examples=plan.examples, report_multiple_bugs=False, **_QUIET)(test)
    example(sequence=plan.sweep if sweep is None else sweep)(seed(plan.seed)(test))()
