"""In-place writes and the output contract.

- A model that counts its calls in place, in a buffer of its own and in a caller-owned argument, both inside a
  compiled (captured) piece: every call writes exactly once, warm-ups and captures included: a capture run
  counts one, a lazy capture serving a request counts one, the caller's argument is incremented once per call.
- A FULL capture copies no input that only a splitting op writes (attention's KV cache): its warm-ups repeat
  those writes instead of putting them back; a lazy one, which serves a call, puts them back (state a
  splitting op advances moves once per call).
- Outputs are valid until the next call (unrelated allocations and an eager run in between leave them intact)
  and are overwritten by it: they are graph memory, not copies (vLLM's contract, both ways).
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn as nn
from hypothesis import example, given
from hypothesis import strategies as st

import pieceworks
from pieceworks import CompilationConfig
from pieceworks.harness.adapters import Pieceworks
from pieceworks.harness.models import llama
from pieceworks.harness.models import toy as models
from pieceworks.harness.testing import strategies as S

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]


class Counting(nn.Module):
    """Counts its calls in place in `calls` (a buffer) and in `counter` (a caller-owned argument, one per
    row)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(1, dtype=torch.int64))

    def forward(self, x: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        counter.add_(1)
        h = torch.tanh(x) * 2
        out = torch.empty_like(h)
        torch.ops.silly.attention(h, h, h, out)
        return out * 0.5  # 3 tanh(x)


@S.gpu_settings(fraction=5)
@given(
    mode=st.sampled_from(["PIECEWISE", "FULL", "FULL_AND_PIECEWISE"]),
    sizes=S.capture_sizes(16, max_count=4),
    lazy=st.booleans(),
    warmups=st.integers(1, 3),
    batches=st.lists(st.integers(1, 24), min_size=1, max_size=6),
)
@example(mode="PIECEWISE", sizes=[4, 8], lazy=False, warmups=2, batches=[3, 8, 30])
def test_inplace_writes_happen_once_per_call(mode, sizes, lazy, warmups, batches):
    torch._dynamo.reset()
    model = Counting().cuda()
    compiled = pieceworks.compile(
        model,
        CompilationConfig(
            splitting_ops=["silly::attention"],
            compiler="eager",
            cudagraph_mode=mode,
            cudagraph_capture_sizes=sizes,
            lazy_capture=lazy,
            cudagraph_num_warmups=warmups,
        ),
    )
    counter = torch.zeros(3, dtype=torch.int64, device="cuda")
    compiled(torch.randn(3, 4, device="cuda"), counter)
    assert counter.tolist() == [1, 1, 1]
    # The buffer's count after the first call is
    # test_properties.py::test_first_call_writes_model_state_once's.
    calls = int(model.calls)
    if not lazy:
        compiled.capture()
        # one run per graph or plan captured (FULL_AND_PIECEWISE: two a size, one per kind);
        # warm-ups put back
        runtime = compiled.runtime
        calls += len(
            {
                id(r)
                for n in runtime.captured_sizes
                for uniform in (False, True)
                if (r := runtime.replay_for(n, uniform)) is not None
            }
        )
        assert int(model.calls) == calls, f"capture of {sizes} with {warmups} warm-ups"
    for batch in batches:
        x = torch.randn(batch, 4, device="cuda")
        counter = torch.full((batch,), 7, dtype=torch.int64, device="cuda")
        out = compiled(x, counter)
        calls += 1
        torch.testing.assert_close(out, 3 * torch.tanh(x))
        assert counter.tolist() == [8] * batch, f"batch {batch}: the caller's argument after one call"
        assert int(model.calls) == calls, f"batch {batch}: the model's buffer after one more call"


GRAPHED = [Pieceworks("PIECEWISE", compiler="eager"), Pieceworks("FULL", compiler="eager")]


def _churn() -> None:
    """Unrelated work: allocate and free blocks of many sizes in the default pool, each filled with NaN."""
    for numel in (1, 64, 256, 1024, 4096, 1 << 16, 1 << 20):
        torch.full((numel,), float("nan"), device="cuda")


@pytest.mark.parametrize("impl", GRAPHED, ids=[i.name for i in GRAPHED])
def test_outputs_are_valid_until_the_next_call_and_overwritten_by_it(impl):
    torch.manual_seed(0)
    config = models.ToyLlamaConfig(num_layers=2)
    model = models.ToyLlama(config).cuda()
    inputs = lambda b, seed: models.toy_llama_inputs(b, config, "cuda", seed=seed)  # noqa: E731 - a one-line factory
    built = impl.build(model, lambda b: inputs(b, 0), [4, 8, 16], models.SPLITTING_OPS)
    for batch in [3, 8, 13]:
        first, second = inputs(batch, 1), inputs(batch, 2)
        out = built(*first)
        expected = model(*first)  # an eager run between calls
        _churn()
        torch.cuda.synchronize()
        torch.testing.assert_close(
            out, expected, rtol=1e-4, atol=1e-5, msg=f"batch {batch}: before the next call"
        )
        following = built(*second)
        assert following.data_ptr() == out.data_ptr(), f"batch {batch}: outputs are copies, not graph memory"
        torch.testing.assert_close(
            out,
            model(*second),
            rtol=1e-4,
            atol=1e-5,
            msg=f"batch {batch}: the next call of this size writes into the earlier output",
        )


def test_a_full_capture_copies_no_kv_cache():
    config = dataclasses.replace(llama.TINY, max_blocks_per_seq=256)  # caches of 32 MiB, activations of a few
    model = llama.Llama(config).cuda()
    compiled = pieceworks.compile(
        model,
        CompilationConfig(
            splitting_ops=llama.SPLITTING_OPS, cudagraph_mode="FULL", cudagraph_capture_sizes=[4, 8]
        ),
    )
    with torch.no_grad():
        compiled(*llama.decode_batch(model, 3, device="cuda"))
        compiled.capture([8])  # the capture stream and its cuBLAS workspace: made once, before the reading
        compiled.runtime.reset()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        compiled.capture()
    caches = sum(b.numel() * b.element_size() for n, b in model.named_buffers() if n.endswith("_cache"))
    assert compiled.runtime.replay_for(8, False) is not None  # a FULL graph was captured
    assert torch.cuda.max_memory_allocated() - before < caches / 4


_lib = torch.library.Library("pwtest", "FRAGMENT")
_lib.define("advance(Tensor(a!) state) -> ()")


def _advance(state: torch.Tensor) -> None:
    state.add_(1)


_lib.impl("advance", _advance, "CompositeExplicitAutograd")
torch.library.register_fake("pwtest::advance")(lambda state: None)


class Advancing(nn.Module):
    """A splitting op that advances a state buffer by one per call (a recurrent state's step, not
    idempotent)."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.ops.pwtest.advance(self.state)
        return x * 2 + self.state


def test_a_lazy_full_capture_advances_a_splitting_ops_state_once_per_call():
    model = Advancing().cuda()
    compiled = pieceworks.compile(
        model,
        CompilationConfig(
            splitting_ops=["pwtest::advance"],
            compiler="eager",
            cudagraph_mode="FULL",
            cudagraph_capture_sizes=[4],
            lazy_capture=True,
            cudagraph_num_warmups=2,
        ),
    )
    x = torch.ones(4, 3, device="cuda")
    for call in range(1, 4):  # the first call traces, the second captures (lazily), the third replays
        out = compiled(x)
        assert float(model.state) == call and torch.equal(out, x * 2 + call), (call, float(model.state))
