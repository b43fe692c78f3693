"""Property 6 (GPU): after capture, any sequence of batch sizes gives eager's results.

Random programs (attention-style splitting ops, in-place writes to inputs and intermediates) and ToyLlama,
random capture sizes, random serving sequences (ascending, descending, repeated, above the largest size),
capture up front or lazily in the middle of serving. Before each call the padded rows of the static buffers
are poisoned with NaN, +inf or -inf; each output is checked while the caller may still hold it (before the
next call, within the contract), so a capture or replay of another size that overwrote it would show (the
SGLang #37606 hazard).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import pieceworks
from pieceworks import CompilationConfig, CUDAGraphMode
from pieceworks.harness.models import toy as models
from pieceworks.harness.testing import strategies as S

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]

# Each example traces, compiles and captures a model: a third of the profile's examples keeps the GPU suite
# short, and a failure is reported as found, not shrunk (see S.gpu_settings).
GPU_SETTINGS = S.gpu_settings(fraction=3)
SIZES = S.capture_sizes(32, max_count=6)
SEQUENCES = S.batch_sequences(32, max_len=8)
MODES = st.sampled_from([CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL, CUDAGraphMode.FULL_AND_PIECEWISE])


POISONS = (float("nan"), float("inf"), float("-inf"))


def _poison_padding(compiled, batch: int, value: float) -> None:
    for buffer in compiled.static_inputs.buffers if compiled.static_inputs is not None else []:
        if isinstance(buffer, torch.Tensor) and buffer.is_floating_point():
            buffer[batch:].fill_(value)


def _serve(compiled, module, make_inputs, sequence):
    for i, batch in enumerate(sequence):
        args = make_inputs(batch)
        eager_args = [a.clone() for a in args]
        expected = module(*eager_args)
        _poison_padding(compiled, batch, POISONS[i % len(POISONS)])
        got = compiled(*args)
        got, expected = (got, expected) if isinstance(got, tuple) else ((got,), (expected,))
        for g, e in zip(got, expected, strict=True):
            assert g.shape == e.shape
            torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5)
        for a, e in zip(args, eager_args):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-5)  # in-place writes reached the caller


@GPU_SETTINGS
@given(
    program=S.programs(max_len=8, splitting=("attention",)),
    sizes=SIZES,
    sequence=SEQUENCES,
    mode=MODES,
    lazy=st.booleans(),
)
def test_replay_matches_eager_for_any_batch_sequence(program, sizes, sequence, mode, lazy):
    torch._dynamo.reset()
    module = S.ProgramModule(program).cuda()
    config = CompilationConfig(
        splitting_ops=["silly::attention"],
        compiler="eager",
        cudagraph_mode=mode,
        cudagraph_capture_sizes=sizes,
        lazy_capture=lazy,
    )
    compiled = pieceworks.compile(module, config)
    make_inputs = lambda b: S.program_inputs(b, seed=b, device="cuda")  # noqa: E731 - a one-line factory
    compiled(*make_inputs(3))
    if not lazy:
        compiled.capture()
    _serve(compiled, module, make_inputs, sequence)


@GPU_SETTINGS
@given(sizes=SIZES, sequence=SEQUENCES, mode=MODES, lazy=st.booleans())
def test_toy_llama_replay_matches_eager_for_any_batch_sequence(sizes, sequence, mode, lazy):
    torch._dynamo.reset()
    torch.manual_seed(0)
    config = models.ToyLlamaConfig(num_layers=2)
    module = models.ToyLlama(config).cuda()
    compiled = pieceworks.compile(
        module,
        CompilationConfig(
            splitting_ops=["silly::attention"],
            compiler="eager",
            cudagraph_mode=mode,
            cudagraph_capture_sizes=sizes,
            lazy_capture=lazy,
        ),
    )
    make_inputs = lambda b: models.toy_llama_inputs(b, config, "cuda", seed=b)  # noqa: E731 - a one-line factory
    compiled(*make_inputs(3))
    if not lazy:
        compiled.capture()
    _serve(compiled, module, make_inputs, sequence)
