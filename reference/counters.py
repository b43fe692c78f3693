"""Process-wide compilation counters with vLLM's field names, and `log`, the one logger every module of
pieceworks writes to (named "pieceworks").

Tests read deltas, never absolute values: `with counters.expect(num_inductor_compiles=3): ...` asserts that
the block changed that field by exactly 3 (and names each field that changed by another amount when it
fails). Counters are plain ints bumped from the thread that compiles or captures; they are not synchronised
across threads.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Iterator

log = logging.getLogger("pieceworks")


@dataclasses.dataclass
class CompilationCounter:
    num_models_seen: int = 0
    num_graphs_seen: int = 0
    # every piece of every split graph, splitting pieces included
    num_piecewise_graphs_seen: int = 0
    # pieces that are compiled (and may get CUDA graphs): the non-splitting ones
    num_piecewise_capturable_graphs_seen: int = 0
    num_backend_compilations: int = 0
    num_inductor_compiles: int = 0
    num_eager_compiles: int = 0
    # compiled pieces served by another structurally identical piece's artifact
    num_shared_piece_compiles: int = 0
    num_cudagraph_captured: int = 0
    # compiled pieces (or FULL graphs) that run without a graph because they cannot be captured
    num_cudagraph_uncapturable: int = 0
    num_cache_entries_updated: int = 0
    num_compiled_artifacts_saved: int = 0
    num_compiled_artifacts_loaded: int = 0
    # graphs of loaded artifacts whose code Inductor's own cache lacked and wrote out again (its folder
    # removed, or a TORCHINDUCTOR_CACHE_DIR this host has not filled): on CPU their kernel libraries are built
    # again, on GPU their Triton kernels are unless the artifact's bundle carried them
    num_kernel_rebuilds: int = 0
    # artifacts found truncated, garbled or from another torch build, logged and recompiled
    num_cache_artifacts_rejected: int = 0
    num_dynamo_traces: int = 0
    # first calls served from a model's serving record, without a trace (record.py)
    num_traces_reused: int = 0

    def snapshot(self) -> dict[str, int]:
        return dataclasses.asdict(self)

    @contextlib.contextmanager
    def expect(self, **deltas: int) -> Iterator[None]:
        """Assert that the block changes each named field by exactly the given delta."""
        before = self.snapshot()
        if unknown := sorted(set(deltas) - set(before)):
            raise TypeError(f"counters.expect got unknown fields {unknown}; known fields: {sorted(before)}")
        yield
        changed = {name: getattr(self, name) - before[name] for name in sorted(deltas)}
        if wrong := {name: by for name, by in changed.items() if by != deltas[name]}:
            lines = (f"  {name}: changed by {by}, expected {deltas[name]}" for name, by in wrong.items())
            raise AssertionError("pieceworks counters did not change as expected:\n" + "\n".join(lines))


counters = CompilationCounter()
