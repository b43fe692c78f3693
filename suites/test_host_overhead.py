"""Host overhead of the pieceworks runtime per forward and per piece (pytest-benchmark).

The overhead is what a forward costs beyond its pieces' own work: argument checks, static copies, dispatch and
stitching. `pieceworks.harness.measure.breakdown` records a forward's pieces, times their work alone (graph
replays or compiled code; the splitting ops called directly) and subtracts it from the forward. The numbers go
to `benchmark.extra_info` (see `--benchmark-json`); targets (<= 2 µs a piece on an H100) are read in the
benchmark report, never asserted. What is asserted is what makes the subtraction valid: the recorded work is
every piece of the forward, in order, as graph replays where graphs exist, and redoing it recomputes the
forward's output; and nothing compiles, traces or captures while it is timed.

- CPU (runs everywhere, quickly): eager compiler, mode NONE, a tiny ToyLlama; host clock, torch on one thread.
- GPU (`-m gpu`): Inductor, PIECEWISE and FULL, ToyLlama 12 layers in bfloat16 at batch 1, 64 and 256, vLLM's
  51 capture sizes; CUDA events for the breakdown, and pytest-benchmark's own timer waits for the GPU
  (`timing.synchronized_clock`), 20 forwards per round. Also the replay alone (`breakdown.replay_run`: the
  plan or FULL graph on the static buffers) and forward / replay, the cost of `CompiledModel.__call__` over
  its replay.
"""

from __future__ import annotations

import pytest
import torch

import pieceworks
from pieceworks import counters
from pieceworks.harness.measure import breakdown
from pieceworks.harness.measure.timing import cuda_time_us, host_time_us, synchronized_clock
from pieceworks.harness.models import toy as models

NO_WORK_BUILT = dict(
    num_inductor_compiles=0, num_eager_compiles=0, num_cudagraph_captured=0, num_dynamo_traces=0
)


def _covers_every_piece_in_order(compiled, work) -> None:
    expected = [p.submod_name for p in compiled.runtime.compiled.pieces]
    assert [w.name for w in work] == expected, (
        "the recorded work must be every piece of the forward, in run order"
    )
    assert [w.splitting for w in work] == [p.is_splitting_graph for p in compiled.runtime.compiled.pieces]


def _output_like(value, out: torch.Tensor) -> torch.Tensor:
    """The tensor among a piece's outputs that is the model's output (same trailing shape and dtype)."""
    values = [value] if isinstance(value, torch.Tensor) else list(value)
    return next(
        v
        for v in values
        if isinstance(v, torch.Tensor) and v.shape[1:] == out.shape[1:] and v.dtype == out.dtype
    )


@pytest.fixture
def one_thread():
    """Host overhead, not the thread pool's: torch on one thread while the CPU variant is timed."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.benchmark(group="host overhead, CPU (eager compiler, mode NONE, ToyLlama 2 layers hidden 16)")
def test_host_overhead_cpu(benchmark, one_thread):
    config = models.ToyLlamaConfig(hidden_size=16, mlp_size=32, vocab_size=16, num_layers=2)
    torch.manual_seed(0)
    model = models.ToyLlama(config)
    compiled = pieceworks.compile(
        model,
        pieceworks.CompilationConfig(
            splitting_ops=models.SPLITTING_OPS, compiler="eager", cudagraph_mode="NONE"
        ),
    )
    args = models.toy_llama_inputs(4, config, seed=1)
    compiled(*args)

    out, work = breakdown.record(compiled, args)
    _covers_every_piece_in_order(compiled, work)
    assert len(work) == 2 * config.num_layers + 1 and not any(w.graph_replay for w in work)
    torch.testing.assert_close(out, model(*args), rtol=0, atol=0)
    last = None
    for w in work:
        last = w.run()
    torch.testing.assert_close(_output_like(last, out), out, rtol=0, atol=0)

    with counters.expect(**NO_WORK_BUILT):
        parts = breakdown.measure(
            lambda: compiled(*args), work, lambda fn: host_time_us(fn, warmup=5, reps=15)
        )
        benchmark.extra_info.update(parts, device="cpu", model="ToyLlama(2 layers, hidden 16)", mode="NONE")
        benchmark.pedantic(compiled, args=args, rounds=15, iterations=10, warmup_rounds=2)
    assert parts["pieces"] == len(work)
    low, high = parts["overhead_per_piece_range_us"]
    assert low <= parts["overhead_per_piece_us"] <= high


def test_the_breakdown_takes_the_route_from_the_model(monkeypatch):
    """`breakdown.record` and `replay_run` ask the compiled model which replay a call runs
    (`CompiledModel.route`, with the call's kind) instead of restating the rule (under FULL_DECODE_ONLY a
    mixed call runs unpadded): here a uniform decode call without graphs, recorded piece by piece; no replay
    to run alone."""
    config = models.ToyLlamaConfig(hidden_size=16, mlp_size=32, vocab_size=16, num_layers=2)
    torch.manual_seed(0)
    model = models.ToyLlama(config)
    compiled = pieceworks.compile(
        model,
        pieceworks.CompilationConfig(
            splitting_ops=models.SPLITTING_OPS, compiler="eager", cudagraph_mode="NONE"
        ),
    )
    args = models.toy_llama_inputs(4, config, seed=1)
    compiled(*args)
    asked, route = [], compiled.route
    monkeypatch.setattr(
        compiled,
        "route",
        lambda batch, uniform=False: asked.append((batch, uniform)) or route(batch, uniform),
    )

    out, work = breakdown.record(compiled, args, uniform=True)
    assert asked == [(4, True)]
    _covers_every_piece_in_order(compiled, work)
    torch.testing.assert_close(out, model(*args), rtol=0, atol=0)
    with pytest.raises(ValueError, match="replays no graph"):
        breakdown.replay_run(compiled, 4)
    assert asked[-1] == (4, False)


@pytest.fixture(scope="module")
def shared_cache_dir(tmp_path_factory):
    """One pieceworks cache for the module: the first GPU test compiles, the others load."""
    return str(tmp_path_factory.mktemp("pieceworks-cache"))


@pytest.mark.gpu
@pytest.mark.inductor
@pytest.mark.timeout(300)
@pytest.mark.benchmark(
    group="host overhead, H100-class GPU (Inductor, ToyLlama 12 layers, bfloat16)", timer=synchronized_clock
)
@pytest.mark.parametrize("batch", [1, 64, 256])
@pytest.mark.parametrize("mode", ["PIECEWISE", "FULL"])
def test_host_overhead_gpu(benchmark, shared_cache_dir, mode, batch):
    torch.manual_seed(0)
    model = models.ToyLlama().cuda().to(torch.bfloat16)
    compiled = pieceworks.compile(
        model,
        pieceworks.CompilationConfig(
            splitting_ops=models.SPLITTING_OPS, cudagraph_mode=mode, cache_dir=shared_cache_dir
        ),
    )
    compiled(*models.toy_llama_inputs(3, device="cuda"))
    compiled.capture()
    args = models.toy_llama_inputs(batch, device="cuda", seed=batch)
    expected = model(*args)

    out, work = breakdown.record(compiled, args)
    out = out.clone()
    assert (out.float() - expected.float()).abs().max() <= 0.05 * expected.float().abs().max()
    layers = model.config.num_layers
    if mode == "PIECEWISE":
        _covers_every_piece_in_order(compiled, work)
        assert sum(w.graph_replay for w in work) == layers + 1, "every compiled piece must replay a graph"
    else:
        assert [w.graph_replay for w in work] == [True]
    # Redo the work on the graphs' own buffers, the output poisoned first: the last replay must rewrite it.
    _output_like(work[-1].run(), out).fill_(float("nan"))
    for w in work:
        last = w.run()
    torch.testing.assert_close(_output_like(last, out)[:batch], out, rtol=0, atol=0)
    # The replay alone (plan or FULL graph on the static buffers) must compute the same output: forward /
    # replay is what the call costs over it.
    replay = breakdown.replay_run(compiled, batch)
    _output_like(last, out).fill_(float("nan"))
    torch.testing.assert_close(_output_like(replay(), out)[:batch], out, rtol=0, atol=0)

    with torch.no_grad(), counters.expect(**NO_WORK_BUILT):
        parts = breakdown.measure(lambda: compiled(*args), work, cuda_time_us, replay=replay)
        benchmark.extra_info.update(
            parts,
            device=torch.cuda.get_device_name(),
            model="ToyLlama(12 layers)",
            dtype="bfloat16",
            mode=mode,
            batch=batch,
            torch=torch.__version__,
        )
        benchmark.pedantic(compiled, args=args, rounds=50, iterations=20, warmup_rounds=5)


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_the_breakdown_records_each_call_as_full_decode_only_runs_it():
    """Under FULL_DECODE_ONLY a mixed call runs unpadded on its own tensors, without CUDA graphs, and a
    uniform decode call replays its FULL graph at the padded size: the breakdown records each as it ran."""
    torch.manual_seed(0)
    model = models.ToyLlama(models.ToyLlamaConfig(num_layers=2)).cuda()
    config = pieceworks.CompilationConfig(
        splitting_ops=models.SPLITTING_OPS,
        compiler="eager",
        cudagraph_mode="FULL_DECODE_ONLY",
        cudagraph_capture_sizes=[4, 8],
    )
    compiled = pieceworks.compile(model, config)
    compiled(*models.toy_llama_inputs(3, device="cuda"))
    compiled.capture()
    args = models.toy_llama_inputs(5, device="cuda", seed=5)
    out, work = breakdown.record(compiled, args)
    out = out.clone()
    _covers_every_piece_in_order(compiled, work)
    assert not any(w.graph_replay for w in work)
    for w in work:
        last = w.run()
    assert _output_like(last, out).shape[0] == 5  # the call's own rows, not the 8 of the static buffers
    torch.testing.assert_close(_output_like(last, out), out, rtol=0, atol=0)
    out, work = breakdown.record(compiled, args, uniform=True)
    out = out.clone()
    assert [w.graph_replay for w in work] == [True]
    torch.testing.assert_close(_output_like(work[0].run(), out)[:5], out, rtol=0, atol=0)
