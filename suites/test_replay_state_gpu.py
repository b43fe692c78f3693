"""Stateful replay: one compiled ToyLlama served like an engine serves it, every step vs eager.

A hypothesis state machine: a model built in one of the graph modes with random capture sizes, captured up
front or lazily; then any interleaving of calls of random sizes (captured, between captured sizes, above the
largest), re-captures, in-place weight updates (new values loaded into the parameters the graphs read), and
outputs kept as clones or as views. Invariants: every call equals eager; a kept view is intact until the next
call; kept clones never change (no graph writes to memory it does not own). No shrinking on the GPU
(`S.gpu_settings`).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import pieceworks
from pieceworks import CompilationConfig
from pieceworks.harness.models import toy as models
from pieceworks.harness.testing import strategies as S

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(150)]

CONFIG = models.ToyLlamaConfig(num_layers=2)
TOLERANCE = dict(rtol=1e-4, atol=1e-5)


def _inputs(batch: int, seed: int):
    return models.toy_llama_inputs(batch, CONFIG, "cuda", seed=seed)


class ServingMachine(RuleBasedStateMachine):
    @initialize(
        mode=st.sampled_from(["PIECEWISE", "FULL", "FULL_AND_PIECEWISE"]),
        sizes=S.capture_sizes(32, max_count=5),
        lazy=st.booleans(),
    )
    def build(self, mode, sizes, lazy):
        torch._dynamo.reset()
        torch.manual_seed(0)
        self.model = models.ToyLlama(CONFIG).cuda()
        self.lazy = lazy
        self.compiled = pieceworks.compile(
            self.model,
            CompilationConfig(
                splitting_ops=models.SPLITTING_OPS,
                compiler="eager",
                cudagraph_mode=mode,
                cudagraph_capture_sizes=sizes,
                lazy_capture=lazy,
            ),
        )
        self.calls = 0
        self.compiled(*_inputs(3, seed=0))
        if not lazy:
            self.compiled.capture()
        self.view = None  # (output kept without cloning, its expected values): valid until the next call
        self.clones = []  # (clone, its values when kept)

    def _check_view(self):
        if self.view is not None:
            torch.testing.assert_close(
                *self.view, **TOLERANCE, msg="a kept output changed before the next call"
            )
            self.view = None

    @rule(batch=st.integers(1, 40), keep=st.sampled_from(["drop", "view", "clone"]))
    def call(self, batch, keep):
        self._check_view()
        self.calls += 1
        args = _inputs(batch, seed=self.calls)
        expected = self.model(*args)
        got = self.compiled(*args)
        torch.testing.assert_close(got, expected, **TOLERANCE, msg=f"call {self.calls}, batch {batch}")
        if keep == "view":
            self.view = (got, expected)
        elif keep == "clone":
            self.clones.append((got.clone(), expected))

    @rule()
    def recapture(self):
        """Drop every graph and capture again (lazily: on the next call of each size)."""
        self._check_view()
        self.compiled.runtime.reset()
        if not self.lazy:
            self.compiled.capture()

    @rule(which=st.integers(0, 63), seed=st.integers(0, 2**16))
    def load_weights(self, which, seed):
        """Load new values into one parameter in place, as a weight update does: the graphs read its
        address."""
        self._check_view()
        params = list(self.model.parameters())
        param = params[which % len(params)]
        values = torch.randn(param.shape, generator=torch.Generator().manual_seed(seed)) * 0.02
        param.copy_(values.to(param.device))

    @invariant()
    def clones_never_change(self):
        for clone, values in self.clones:
            torch.testing.assert_close(clone, values, **TOLERANCE, msg="a cloned output changed")

    def teardown(self):
        torch.cuda.synchronize()


ServingMachine.TestCase.settings = S.gpu_settings(fraction=5, stateful_step_count=12)
test_serving_any_sequence_matches_eager = ServingMachine.TestCase


@pytest.mark.parametrize("mode", ["PIECEWISE", "FULL"])
def test_weights_loaded_in_place_reach_every_captured_size(mode):
    """A weight update in place (new values written into the parameters) is read by every captured graph's
    next replay: graphs read the parameters' own memory, never a copy taken at capture. The deterministic core
    of the state machine's `load_weights` rule, which a short random run may not reach."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = models.ToyLlama(CONFIG).cuda()
    compiled = pieceworks.compile(
        model,
        CompilationConfig(
            splitting_ops=models.SPLITTING_OPS,
            compiler="eager",
            cudagraph_mode=mode,
            cudagraph_capture_sizes=[4, 8],
        ),
    )
    compiled(*_inputs(3, seed=0))
    compiled.capture()
    assert sorted(compiled.runtime.captured_sizes) == [4, 8], "both sizes captured: the calls below replay"
    generator = torch.Generator().manual_seed(1)
    for round_ in range(2):
        for param in model.parameters():
            param.add_((torch.randn(param.shape, generator=generator) * 0.05).to(param.device))
        for batch in (3, 8):
            args = _inputs(batch, seed=10 * round_ + batch)
            torch.testing.assert_close(
                compiled(*args),
                model(*args),
                **TOLERANCE,
                msg=f"{mode}, weights set #{round_ + 1}, batch {batch}",
            )
