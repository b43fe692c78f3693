"""Hugging Face models as their users call them, and as engines serve them (harness/models/hf_llama.py).

- A transformers Llama (the shipped tiny-llama config, random weights), its attention routed through a
  splitting op, compiled and called with keywords as transformers models are
  (`model(input_ids=ids, use_cache=False)`), returns a `CausalLMOutputWithPast` holding eager's logits, from
  the compiled graph alone. A second process warm-starts it from its serving record with no trace and no
  compile; a changed config value traces again.
- docs/your-model.md's example runs as written, and a second run of it neither traces nor compiles.
- Each shipped tiny config (Llama, Qwen3, Gemma) builds as a paged model whose every layer calls the
  paged-attention splitting op with its own KV cache (the model's buffers), and passes the conformance suite's
  CPU properties with pieceworks (mode NONE, Inductor, its warm start included).
Needs transformers (the `test` extra installs it); without it every test here is skipped, saying so.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest
import torch

import pieceworks
from pieceworks import CompilationConfig, counters
from pieceworks.harness.models import hf_llama as hf
from pieceworks.harness.models import llama
from suites.helpers import conformance_command

pytestmark = pytest.mark.skipif(hf.unavailable_reason() is not None, reason=str(hf.unavailable_reason()))

TINY = ["tiny-llama", "tiny-qwen3", "tiny-gemma"]


@pytest.fixture(scope="module", autouse=True)
def conformance_run(early_processes, tmp_path_factory):
    """The conformance suite on the shipped tiny configs, as a user runs it (`--conformance-model PATH`),
    started before the module's first test: it runs beside them on the other core."""
    folder = tmp_path_factory.mktemp("hf-conformance")
    for test, names in CONFORMANCE.items():
        models = [arg for name in names for arg in ("--conformance-model", str(hf.CONFIGS / f"{name}.json"))]
        json_file = str(folder / f"{test.__name__}.json")
        command = conformance_command(
            "-q", "--conformance-device", "cpu", *models, "--impl", "pieceworks-none"
        )
        early_processes.start(
            test,
            [*command, "--conformance-json", json_file],
            env={**os.environ, "PIECEWORKS_HYPOTHESIS_PROFILE": "ci"},
            cwd=folder,
            timeout=500,
        )
    # the serving record a process of its own stores, then a warm and a changed-config process: in order, in
    # one driver process, beside the module's tests
    cases = [{}, {}, {"rms_norm_eps": 1e-2}]
    records = str(folder / "records")
    chain = (
        "import json; from pieceworks.harness.testing.scenario import run_case; print(json.dumps([run_case("
        f"{__file__!r} + ':first_call', {{'cache_dir': {records!r}, 'overrides': o}}, timeout=240) for o in "
        f"{cases!r}]))"
    )
    early_processes.start(
        test_a_transformers_llama_called_with_keywords_warm_starts_without_a_trace,
        [sys.executable, "-c", chain],
        timeout=600,
    )
    example = folder / "your_model.py"
    example.write_text(_python_block_after("## A Hugging Face model in 20 lines"))
    early_processes.start(
        test_the_docs_example_runs_as_written_and_warm_starts_in_a_second_run,
        ["sh", "-c", f'"{sys.executable}" "{example}" && "{sys.executable}" "{example}"'],
        cwd=folder,
        timeout=400,
    )
    return folder


def _python_block_after(marker: str) -> str:
    text = (Path(__file__).resolve().parent.parent / "docs" / "your-model.md").read_text()
    return re.search(r"```python\n(.*?)```", text[text.index(marker) :], re.S).group(1)


def test_the_docs_example_runs_as_written_and_warm_starts_in_a_second_run(early_processes):
    """docs/your-model.md's 20 lines, run twice in one cache: the first run traces once and compiles 3 pieces,
    the second neither traces nor compiles, as its last line's comment says."""
    (proc,) = early_processes.results(test_the_docs_example_runs_as_written_and_warm_starts_in_a_second_run)
    assert proc.returncode == 0, proc.stderr[-4000:]
    promised = re.search(r"# (\d+ \d+); run again: (\d+ \d+)", _python_block_after("## A Hugging Face model"))
    assert proc.stdout.split("\n")[:2] == [promised.group(1), promised.group(2)], (
        proc.stdout,
        proc.stderr[-2000:],
    )


def first_call(cache_dir: str, overrides: dict) -> dict:
    """In a process of its own: the tiny Llama with `overrides`, compiled with the cache in `cache_dir`,
    called with keywords; its first call's seconds, what it traced and compiled, and whether its logits are
    eager's."""
    model = hf.causal_lm(hf.CONFIGS / "tiny-llama.json", num_hidden_layers=1, **overrides)
    compiled = pieceworks.compile(
        model, CompilationConfig(splitting_ops=hf.SPLITTING_OPS, cudagraph_mode="NONE", cache_dir=cache_dir)
    )
    (ids,) = hf.hf_llama_inputs(3, seed=1)
    with torch.no_grad():
        start = time.perf_counter()
        out = compiled(input_ids=ids, use_cache=False)
        seconds = time.perf_counter() - start
        same = torch.allclose(out.logits, model(input_ids=ids, use_cache=False).logits, atol=1e-5, rtol=1e-4)
    return {
        "seconds": seconds,
        "traces": counters.num_dynamo_traces,
        "reused": counters.num_traces_reused,
        "compiles": counters.num_inductor_compiles,
        "output": type(out).__name__,
        "same": same,
    }


@pytest.mark.inductor
@pytest.mark.slow
def test_a_transformers_llama_called_with_keywords_warm_starts_without_a_trace(tmp_path, early_processes):
    model = hf.causal_lm(hf.CONFIGS / "tiny-llama.json", num_hidden_layers=1)
    compiled = pieceworks.compile(
        model,
        CompilationConfig(splitting_ops=hf.SPLITTING_OPS, cudagraph_mode="NONE", cache_dir=str(tmp_path)),
    )
    start = time.perf_counter()
    with counters.expect(num_dynamo_traces=1, num_traces_reused=0):
        out = compiled(input_ids=hf.hf_llama_inputs(3, seed=1)[0], use_cache=False)
    cold = time.perf_counter() - start
    assert compiled.binder is not None, "calls go through Dynamo"
    torch._dynamo.reset()  # nothing below enters Dynamo
    for batch in (3, 1, 6):
        (ids,) = hf.hf_llama_inputs(batch, seed=batch)
        out, expected = compiled(input_ids=ids, use_cache=False), model(input_ids=ids, use_cache=False)
        assert type(out) is type(expected) and list(out.keys()) == ["logits"] == list(expected.keys())
        assert out.loss is None and out.past_key_values is None and out.logits.shape == (batch, hf.SEQ, 128)
        torch.testing.assert_close(out.logits, expected.logits)
    # the record a process of its own stores: transformers' registry of the model classes a process has built
    # (read by the trace) then holds this model's alone, as in a serving process (started with the module)
    (proc,) = early_processes.results(
        test_a_transformers_llama_called_with_keywords_warm_starts_without_a_trace
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    cold_process, warm, changed = json.loads(proc.stdout.splitlines()[-1])
    assert cold_process == {**cold_process, "traces": 1, "reused": 0, "same": True}, cold_process
    assert warm == {
        **warm,
        "traces": 0,
        "reused": 1,
        "compiles": 0,
        "output": "CausalLMOutputWithPast",
        "same": True,
    }, warm
    assert changed == {**changed, "traces": 1, "reused": 0, "same": True}, changed
    print(
        json.dumps(
            {
                "cold_first_call_s": round(cold, 2),
                "warm_first_call_s": round(warm["seconds"], 2),
                "changed_config_first_call_s": round(changed["seconds"], 2),
            }
        )
    )


@pytest.mark.parametrize("name", TINY)
def test_each_shipped_config_builds_with_a_paged_kv_cache_per_layer_called_through_the_splitting_op(name):
    model = hf.paged_model(hf.CONFIGS / f"{name}.json")
    config = model.config
    assert config.num_layers == 2 and len(model.layers) == 2
    names = {name for name, _ in model.named_buffers()}
    for i, cache in enumerate(model.layers):
        assert {
            f"decoder.layers.{i}.self_attn.kv_cache.k_cache",
            f"decoder.layers.{i}.self_attn.kv_cache.v_cache",
        } <= names
        assert cache.k_cache.shape == (
            config.num_blocks,
            config.block_size,
            config.num_kv_heads,
            config.head_dim,
        )
    compiled = pieceworks.compile(
        model, CompilationConfig(splitting_ops=config.splitting_ops, compiler="eager", cudagraph_mode="NONE")
    )
    with torch.no_grad():
        args = llama.decode_batch(model, 5)
        torch.testing.assert_close(compiled(*args), model(*args))
        pieces = compiled.runtime.compiled.pieces
        assert sum(p.is_splitting_graph for p in pieces) == 2 and len(pieces) == 5  # the op, once a layer
        written = [model.layers[i].k_cache[1:].abs().sum() for i in range(2)]  # block 0 is reserved
        assert all(w > 0 for w in written), "every layer writes its own cache"


def _conformance_passed(early_processes, folder: Path, test) -> None:
    """`test`'s conformance run passed the CPU properties on each of its configs (`CONFORMANCE`)."""
    (proc,) = early_processes.results(test)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    results = json.loads((folder / f"{test.__name__}.json").read_text())["results"]
    passed = {
        (r["impl"], os.path.basename(r["model"]), r["property"]) for r in results if r["outcome"] == "pass"
    }
    for name in CONFORMANCE[test]:
        for prop in ("replay-matches-eager", "repeats-give-fresh-outputs", "warm-start-compiles-nothing"):
            assert ("pieceworks-none", f"{name}.json", prop) in passed, (name, prop, sorted(passed))
    assert {r["outcome"] for r in results} <= {"pass", "n/a"}


def test_a_shipped_config_passes_the_cpu_conformance_properties(early_processes, conformance_run):
    _conformance_passed(
        early_processes, conformance_run, test_a_shipped_config_passes_the_cpu_conformance_properties
    )


@pytest.mark.slow
def test_every_shipped_config_passes_the_cpu_conformance_properties(early_processes, conformance_run):
    _conformance_passed(
        early_processes, conformance_run, test_every_shipped_config_passes_the_cpu_conformance_properties
    )


# The conformance run of each test, as a user runs it (`--conformance-model PATH`): one config by default,
# every one in the opt-in set
CONFORMANCE = {
    test_a_shipped_config_passes_the_cpu_conformance_properties: ["tiny-qwen3"],
    test_every_shipped_config_passes_the_cpu_conformance_properties: TINY,
}


def test_the_serving_benchmark_takes_a_config_json_and_runs_on_a_cpu_up_to_where_cuda_is_needed(
    monkeypatch, tmp_path
):
    """`$PIECEWORKS_MODEL_CONFIG` names the model of `serving.ModelConfigUnified` (relative to the repository,
    as asv runs benchmarks in other folders), and the model is named after what it is (architecture and size,
    not the file): it builds with the Llama presets' batch and cache sizes; on a CPU the class builds it as a
    paged model and serves a decode and a mixed step as eager does (`cpu_check`, in its details), and says the
    rest needs CUDA."""
    from suites.benchmarks import serving as bench

    monkeypatch.delenv(bench.MODEL_CONFIG, raising=False)
    with pytest.raises(
        LookupError, match=r"\$PIECEWORKS_MODEL_CONFIG is unset. Fix: set it to a Hugging Face"
    ):
        bench.model_config()
    monkeypatch.setenv(bench.MODEL_CONFIG, "harness/models/configs/tiny-qwen3.json")
    monkeypatch.setenv("PIECEWORKS_BENCH_DETAILS", str(tmp_path / "details"))
    monkeypatch.chdir(tmp_path)
    path, name = bench.model_config()
    assert name == "hf_qwen3_115k" and path == str(hf.CONFIGS / "tiny-qwen3.json")
    assert bench.config_name(str(hf.CONFIGS / "qwen3-1.7b.json")) == "hf_qwen3_1_72b"
    config = bench.serving_model(name, "varlen", device="cpu", dtype="float32").config
    assert (
        config.splitting_ops,
        config.max_tokens,
        config.max_seqs,
        config.max_context,
        config.head_dim,
    ) == (["llama::paged_attention_varlen"], 512, 512, 2048, 32)
    if not torch.cuda.is_available():
        assert "needs CUDA" in bench.ModelConfigUnified().setup_cache()["skip"]
        details = json.loads((tmp_path / "details" / f"serving_{name}_unified.json").read_text())
        assert details["cpu_check"].startswith("built as a paged model on the CPU"), details
        gpt2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "vocab_size": 128}
        (tmp_path / "gpt2.json").write_text(json.dumps(gpt2))  # a causal LM, not laid out as Llama's
        monkeypatch.setenv(bench.MODEL_CONFIG, str(tmp_path / "gpt2.json"))  # fails here, not on a GPU
        with pytest.raises(ValueError, match=r"a gpt2 config has no intermediate_size.*Fix: give a decoder"):
            bench.ModelConfigUnified().setup_cache()


def test_a_user_model_start_without_its_config_is_a_usage_error_naming_the_fix(capsys):
    from pieceworks.harness.testing import scenario

    with pytest.raises(SystemExit) as stopped:
        scenario.main(["--model", "hf"])
    assert stopped.value.code == 2 and "--model hf needs --config PATH" in capsys.readouterr().err
