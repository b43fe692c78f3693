"""CUDA-graph capture and replay on a GPU: correctness in every mode, padding, counters, safety, memory."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn as nn

import pieceworks
from pieceworks import CompilationConfig, CUDAGraphMode, counters
from pieceworks.core import FullReplay, ReplayPlan
from pieceworks.cudagraph import ReplayAddressError
from pieceworks.harness.models import toy as models
from pieceworks.harness.testing.checked import CheckedModel, OutputOverwrittenError
from pieceworks.runtime import CUDAGraphMissingError, Phase

# Pool sharing (one pool for all sizes vs one each, and vs the largest alone) is in test_pool_gpu.py.
pytestmark = [pytest.mark.gpu, pytest.mark.timeout(120)]

SIZES = [1, 2, 4, 8, 16, 32]
BATCHES = [1, 2, 3, 4, 5, 8, 13, 16, 17, 31, 32, 33, 100]  # captured, padded, and above the largest size
GRAPH_MODES = [CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL, CUDAGraphMode.FULL_AND_PIECEWISE]


@pytest.fixture(scope="module")
def shared_cache(tmp_path_factory):
    """One compile cache for the module: every mode after the first loads the same Inductor artifacts."""
    return str(tmp_path_factory.mktemp("pieceworks-gpu-cache"))


def _make(name):
    torch.manual_seed(0)
    if name == "silly":
        return models.SillyModel().cuda(), lambda b: (torch.randn(b, device="cuda"),)
    config = models.ToyLlamaConfig(num_layers=4)
    return models.ToyLlama(config).cuda(), lambda b: models.toy_llama_inputs(b, config, "cuda", seed=b)


def _compiled(model, inputs, mode, cache, compiler="inductor", **kwargs):
    config = CompilationConfig(
        splitting_ops=models.SPLITTING_OPS,
        cudagraph_mode=mode,
        compiler=compiler,
        cudagraph_capture_sizes=kwargs.pop("sizes", SIZES),
        cache_dir=cache,
        **kwargs,
    )
    compiled = pieceworks.compile(model, config)
    compiled(*inputs(3))
    return compiled


@pytest.mark.parametrize("name", ["silly", "toy_llama"])
@pytest.mark.parametrize("mode", GRAPH_MODES)
def test_replay_equals_no_graph_run_and_eager(name, mode, shared_cache):
    model, inputs = _make(name)
    plain = _compiled(model, inputs, CUDAGraphMode.NONE, shared_cache)
    graphed = _compiled(model, inputs, mode, shared_cache)
    graphed.capture()
    for batch in BATCHES:
        args = inputs(batch)
        expected = model(*args)
        got = graphed(*args).clone()
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
        n = next((s for s in SIZES if s >= batch), batch)
        # The same compiled code at the same (padded) size without graphs: bitwise equal on the real rows.
        padded = [torch.cat([a, a[:1].expand(n - batch, *a.shape[1:])]) for a in args]
        assert torch.equal(got, plain(*padded)[:batch]), f"batch {batch} (padded to {n})"


def test_counters_count_graphs_per_piece_and_size(shared_cache):
    model, inputs = _make("toy_llama")
    layers = model.config.num_layers
    for mode, per_size in [
        (CUDAGraphMode.PIECEWISE, layers + 1),
        (CUDAGraphMode.FULL, 1),
        (CUDAGraphMode.FULL_DECODE_ONLY, 1),  # uniform decode only
        (CUDAGraphMode.FULL_AND_PIECEWISE, 1 + layers + 1),
    ]:  # a full graph and a plan per size
        compiled = _compiled(model, inputs, mode, shared_cache)
        with counters.expect(num_cudagraph_captured=per_size * len(SIZES)):
            report = compiled.capture()
        assert report["graphs"] == per_size * len(SIZES) and report["sizes"] == len(SIZES)


@pytest.mark.parametrize("mode", [CUDAGraphMode.FULL_AND_PIECEWISE, CUDAGraphMode.FULL_DECODE_ONLY])
def test_each_kind_of_batch_replays_what_its_mode_gives_it(shared_cache, mode):
    """Uniform decode calls (inside `uniform_decode()`) replay the size's FULL graph; mixed calls its
    PIECEWISE plan (FULL_AND_PIECEWISE) or no graph at all, unpadded (FULL_DECODE_ONLY); both like eager."""
    model, inputs = _make("toy_llama")
    compiled = _compiled(model, inputs, mode, shared_cache)
    compiled.capture()
    runtime, served = compiled.runtime, []
    for n in SIZES:
        full, mixed = runtime.replay_for(n, True), runtime.replay_for(n, False)
        assert isinstance(full, FullReplay)
        assert (
            isinstance(mixed, ReplayPlan) and not isinstance(mixed, FullReplay)
            if mode.has_piecewise
            else mixed is None
        )
        for replay in {full, mixed} - {None}:
            replay.run = (lambda run, kind: lambda *a: served.append(kind) or run(*a))(
                replay.run, type(replay).__name__
            )
    for batch in BATCHES:
        args = inputs(batch)
        expected = model(*args)
        for uniform in (True, False):
            served.clear()
            with pieceworks.uniform_decode(uniform):
                got = compiled(*args)
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)
            graph = batch <= max(SIZES)
            want = (
                ["FullReplay"]
                if graph and uniform
                else ["ReplayPlan"]
                if graph and mode.has_piecewise
                else []
            )
            assert served == want, f"batch {batch}, uniform decode {uniform}: served by {served}, not {want}"
            padded, replay = compiled.route(batch, uniform)  # the rule tools ask: what this call ran
            assert served == ([type(replay).__name__] if replay is not None else []), (batch, uniform)
            assert (padded is None) == (not want), (batch, uniform, padded)


def test_capture_phase_closes(shared_cache, caplog):
    model, inputs = _make("silly")
    compiled = _compiled(model, inputs, CUDAGraphMode.PIECEWISE, shared_cache, compiler="eager")
    compiled.capture()
    runtime = compiled.runtime
    assert runtime.phase is Phase.SERVING
    caplog.set_level("INFO", logger="pieceworks")
    with counters.expect(num_cudagraph_captured=0, num_backend_compilations=0, num_graphs_seen=0):
        for batch in BATCHES:
            x = inputs(batch)[0]
            torch.testing.assert_close(compiled(x), models.silly_model_expected(x))
    assert sorted(runtime.captured_sizes) == SIZES and list(runtime.captured_sizes) == sorted(
        SIZES, reverse=True
    )
    assert all(
        isinstance(runtime.replay_for(n, False), ReplayPlan)
        and not isinstance(runtime.replay_for(n, False), FullReplay)
        for n in SIZES
    )


def test_raw_backend_after_capture_raises_or_runs_without_graph(shared_cache):
    model, _ = _make("silly")
    for policy in ["raise", "eager"]:
        torch._dynamo.reset()
        config = CompilationConfig(
            splitting_ops=models.SPLITTING_OPS,
            compiler="eager",
            cudagraph_capture_sizes=SIZES,
            on_missing_graph=policy,
        )
        backend = pieceworks.Backend(config)
        fn = torch.compile(
            model,
            backend=backend,
            fullgraph=True,
            dynamic=False,
            options={"guard_filter_fn": lambda entries: [False] * len(entries)},
        )
        static = torch.randn(32, device="cuda")
        first = static[:5].clone()
        torch._dynamo.mark_dynamic(first, 0)
        fn(first)
        runtime = backend.runtimes[0]
        with runtime.capture_phase(SIZES) as phase:
            for n, uniform in phase.plan:
                with pieceworks.uniform_decode(uniform):
                    fn(static[:n])
        torch.testing.assert_close(fn(static[:8]), models.silly_model_expected(static[:8]))
        if policy == "raise":
            with pytest.raises(CUDAGraphMissingError, match="batch size 3 has no CUDA graph"):
                fn(static[:3])
        else:
            torch.testing.assert_close(fn(static[:3]), models.silly_model_expected(static[:3]))
        # a captured size called with a tensor that is not the captured buffer
        with pytest.raises(ReplayAddressError, match=r"piece submod_0 .* input 0 .*batch size 8"):
            fn(torch.randn(8, device="cuda"))


def test_debug_mode_checks_parameters_too(shared_cache):
    config_args = dict(splitting_ops=models.SPLITTING_OPS, compiler="eager", cudagraph_capture_sizes=[4, 8])
    torch.manual_seed(0)
    model = models.ToyLlama(models.ToyLlamaConfig(num_layers=1)).cuda()
    for debug in [False, True]:
        compiled = pieceworks.compile(model, CompilationConfig(debug_replay_checks=debug, **config_args))
        compiled(*models.toy_llama_inputs(3, model.config, "cuda"))
        compiled.capture()
        weight = model.layers[0].mlp.down_proj.weight
        old = weight.data
        weight.data = old.clone()  # the graph still reads the old address
        try:
            if debug:
                with pytest.raises(ReplayAddressError, match="down_proj"):
                    compiled(*models.toy_llama_inputs(3, model.config, "cuda"))
            else:
                compiled(
                    *models.toy_llama_inputs(3, model.config, "cuda")
                )  # the cheap check skips parameters
        finally:
            weight.data = old


@pytest.mark.parametrize("mode", [CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL])
def test_a_parameters_data_reassigned_after_capture_is_traced_again_never_replayed_stale(mode, caplog):
    """`weight.data = new` frees the memory the CUDA graphs read: the next call traces again (one WARNING)
    and gives eager's output with the new weights, where a replay would read freed memory."""
    torch.manual_seed(0)
    model = models.ToyLlama(models.ToyLlamaConfig(num_layers=1)).cuda()
    config = dict(splitting_ops=models.SPLITTING_OPS, compiler="eager", cudagraph_capture_sizes=[4, 8])
    compiled = pieceworks.compile(model, CompilationConfig(cudagraph_mode=mode, **config))
    inputs = models.toy_llama_inputs(3, model.config, "cuda")
    compiled(*inputs)
    compiled.capture()
    weight = model.layers[0].mlp.down_proj.weight
    weight.data = torch.randn_like(weight) * 10  # the old memory is freed: nothing else holds it
    caplog.set_level("WARNING", logger="pieceworks")
    with torch.no_grad(), counters.expect(num_dynamo_traces=1):
        torch.testing.assert_close(compiled(*inputs), model(*inputs))
    assert "mlp.down_proj.weight was given other memory (.data =)" in caplog.text


def test_padded_rows_never_leak_into_real_rows(shared_cache):
    model, inputs = _make("silly")
    compiled = _compiled(model, inputs, CUDAGraphMode.PIECEWISE, shared_cache, compiler="eager")
    compiled.capture()
    poison = torch.full((32,), float("inf"), device="cuda")
    poison[::2] = float("nan")
    compiled(poison)  # leaves inf and NaN in every row of the static buffer
    for batch in [1, 3, 5, 17]:
        x = torch.randn(batch, device="cuda")
        out = compiled(x)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, models.silly_model_expected(x))


def test_uncapturable_piece_runs_without_graph(shared_cache, caplog):
    class MutatesSplitOutput(nn.Module):
        def forward(self, x):
            y = x * 2
            a, b = torch.ops.silly.pair(y)
            a.add_(1)
            return a * b + y

    caplog.set_level("WARNING", logger="pieceworks")
    model = MutatesSplitOutput()
    compiled = pieceworks.compile(
        model,
        CompilationConfig(splitting_ops=["silly::pair"], compiler="eager", cudagraph_capture_sizes=SIZES),
    )
    with counters.expect(num_cudagraph_uncapturable=1):
        compiled(torch.randn(3, device="cuda"))
    with counters.expect(num_cudagraph_captured=len(SIZES)):  # the first piece only
        compiled.capture()
    assert "mutates input" in caplog.text and "runs without a CUDA graph" in caplog.text
    for batch in [1, 5, 32]:
        x = torch.randn(batch, device="cuda")
        torch.testing.assert_close(compiled(x), model(x))


def _pool_segments(pool):
    return [s for s in torch.cuda.memory_snapshot() if tuple(s.get("segment_pool_id", ())) == tuple(pool)]


def test_no_pool_memory_left_after_the_model_is_deleted(shared_cache):
    model, inputs = _make("toy_llama")
    compiled = _compiled(model, inputs, CUDAGraphMode.PIECEWISE, shared_cache)
    compiled.capture()
    compiled(*inputs(7))
    pool = compiled.runtime.pool.handle
    assert _pool_segments(pool), "the capture should have put segments in its pool"
    del compiled
    torch._dynamo.reset()
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    leftovers = _pool_segments(pool)
    live = [b for s in leftovers for b in s["blocks"] if b["state"] == "active_allocated"]
    assert live == [] and leftovers == []


def test_outputs_are_valid_until_the_next_replay_and_checked_mode_says_so(shared_cache):
    model, inputs = _make("silly")
    compiled = _compiled(model, inputs, CUDAGraphMode.PIECEWISE, shared_cache, compiler="eager")
    compiled.capture()
    checked = CheckedModel(compiled)
    a = checked(torch.ones(8, device="cuda")).clone()
    b = checked(torch.zeros(8, device="cuda"))
    torch.testing.assert_close(a, torch.full((8,), 28.0, device="cuda"))
    with pytest.raises(OutputOverwrittenError, match="call #2"):
        checked(torch.ones(8, device="cuda"))
    del b


def test_graphs_survive_reduce_overhead_recording_in_the_same_process(shared_cache):
    """torch.compile(mode="reduce-overhead") clears cuBLAS workspaces and empties the cache at each recording;
    our captured GEMMs keep using the capture stream's workspace, which must not be freed under them."""
    model, inputs = _make("toy_llama")
    compiled = _compiled(model, inputs, CUDAGraphMode.PIECEWISE, shared_cache, compiler="eager")
    compiled.capture()
    other = torch.compile(models.ToyLlama(model.config).cuda(), mode="reduce-overhead", dynamic=False)
    for batch in [3, 5, 9]:
        for _ in range(3):
            other(*inputs(batch))
    torch.cuda.empty_cache()
    scribble = torch.full((64 << 20,), float("nan"), device="cuda")  # reuse whatever was freed
    del scribble
    for batch in [1, 7, 32]:
        args = inputs(batch)
        torch.testing.assert_close(compiled(*args), model(*args), rtol=1e-4, atol=1e-4)
    torch.cuda.synchronize()


class FreshSplitOutputs(nn.Module):
    """silly::pair allocates its outputs anew on every call; the captured piece after it reads them."""

    def forward(self, x):
        a, b = torch.ops.silly.pair(x * 3)
        return a * b + 1


def test_fresh_splitting_outputs_are_copied_to_the_captured_address(shared_cache):
    model = FreshSplitOutputs()
    compiled = pieceworks.compile(
        model,
        CompilationConfig(splitting_ops=["silly::pair"], compiler="eager", cudagraph_capture_sizes=SIZES),
    )
    compiled(torch.randn(3, device="cuda"))
    with counters.expect(num_cudagraph_captured=2 * len(SIZES), num_cudagraph_uncapturable=0):
        compiled.capture()
    plan = compiled.runtime.replay_for(8, False)
    assert isinstance(plan, ReplayPlan) and not isinstance(plan, FullReplay)
    assert len(plan.cuda_graphs) == 2 and len(plan.kept) == 2
    for batch in [1, 5, 8, 8, 32, 3]:
        x = torch.randn(batch, device="cuda")
        torch.testing.assert_close(compiled(x), model(x))


def test_serving_calls_the_graph_directly_and_the_tracing_call_captures_nothing(shared_cache):
    model, inputs = _make("toy_llama")
    config = CompilationConfig(
        splitting_ops=models.SPLITTING_OPS, compiler="eager", cudagraph_capture_sizes=SIZES, lazy_capture=True
    )
    compiled = pieceworks.compile(model, config)
    captured = counters.num_cudagraph_captured
    # The first call (batch >= 2) traces on the caller's own tensors and returns that run's result: it runs
    # the model once and captures nothing. The next call of a capture size captures it lazily, from the static
    # buffers: every graph it makes belongs to that size's plan, and the plan reads the static buffers.
    args = inputs(3)
    torch.testing.assert_close(compiled(*args), model(*args), rtol=1e-4, atol=1e-4)
    runtime = compiled.runtime
    assert compiled.binder is not None and runtime.phase is Phase.SERVING
    assert runtime.captured_sizes == () and counters.num_cudagraph_captured == captured
    torch.testing.assert_close(compiled(*args), model(*args), rtol=1e-4, atol=1e-4)
    assert runtime.captured_sizes == (4,)
    plan = runtime.replay_for(4, False)
    assert counters.num_cudagraph_captured - captured == len(plan.cuda_graphs)
    flat = compiled.graph_inputs(4)
    assert plan.all_checks and all(flat[i].data_ptr() == address for i, address, *_ in plan.all_checks)
    torch._dynamo.reset()  # no later call enters Dynamo
    with counters.expect(num_dynamo_traces=0, num_backend_compilations=0):
        for batch in [3, 3, 16, 1]:
            args = inputs(batch)
            torch.testing.assert_close(compiled(*args), model(*args), rtol=1e-4, atol=1e-4)
    assert runtime.captured_sizes == (4, 16, 1)
