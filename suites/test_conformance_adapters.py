"""The conformance suite's new adapters and tools, on a CPU: the vLLM adapter's contract against a fake `vllm`
(vLLM is not installable on the GPU image), user adapters by file path, dict outputs cut back, the HF Llama's
splitting op and row independence, the plugin's failure examples and one-line verdicts, why a property does
not apply, and the table from a results document."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import sys
import types

import pytest
import torch

from pieceworks.conformance import table as conformance_table
from pieceworks.conformance.plugin import failure_example, first_line
from pieceworks.core import unpad as _cut
from pieceworks.harness import adapters
from pieceworks.harness.adapters import VLLM, resolve
from pieceworks.harness.models import toy as models


def _fake_vllm(monkeypatch) -> list:
    """Install a fake `vllm` with the API the adapter uses; returns the log of what the adapter did with
    it."""
    log: list = []
    current: dict = {}

    class CompilationMode(enum.Enum):
        VLLM_COMPILE = 3

    class CUDAGraphMode(enum.Enum):
        NONE = 0
        PIECEWISE = 1

    @dataclasses.dataclass
    class CompilationConfig:
        mode: CompilationMode
        cudagraph_mode: CUDAGraphMode
        splitting_ops: list
        cudagraph_capture_sizes: list

    @dataclasses.dataclass
    class VllmConfig:
        compilation_config: CompilationConfig

    @dataclasses.dataclass(frozen=True)
    class BatchDescriptor:
        num_tokens: int

    @contextlib.contextmanager
    def set_current_vllm_config(config):
        yield

    @contextlib.contextmanager
    def set_forward_context(attn_metadata, vllm_config, cudagraph_runtime_mode=None, batch_descriptor=None):
        current.update(
            mode=cudagraph_runtime_mode.name, tokens=batch_descriptor and batch_descriptor.num_tokens
        )
        yield
        current.clear()

    def support_torch_compile(cls=None, *, dynamic_arg_dims=None):
        def wrap(cls):
            log.append(("dynamic_arg_dims", dynamic_arg_dims))
            forward = cls.forward

            def logged(self, *args):
                log.append((current["mode"], current["tokens"], args[0].shape[0]))
                return forward(self, *args)

            cls.forward = logged
            return cls

        return wrap

    modules = {
        name: types.ModuleType(name)
        for name in [
            "vllm",
            "vllm.compilation",
            "vllm.compilation.decorators",
            "vllm.config",
            "vllm.forward_context",
        ]
    }
    modules["vllm.compilation.decorators"].support_torch_compile = support_torch_compile
    for name, value in dict(
        CompilationConfig=CompilationConfig,
        CompilationMode=CompilationMode,
        CUDAGraphMode=CUDAGraphMode,
        VllmConfig=VllmConfig,
        set_current_vllm_config=set_current_vllm_config,
    ).items():
        setattr(modules["vllm.config"], name, value)
    modules["vllm.forward_context"].BatchDescriptor = BatchDescriptor
    modules["vllm.forward_context"].set_forward_context = set_forward_context
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)
    log.append(("config_class", CompilationConfig))
    return log


def test_vllm_adapter_drives_vllm_as_its_model_runner_does(monkeypatch):
    """Compile once under NONE, capture largest first under PIECEWISE, pad to a captured size, run above the
    largest under NONE, cut back; the fake runs the model eagerly, so results are the model's."""
    log = _fake_vllm(monkeypatch)
    config = models.ToyLlamaConfig(hidden_size=16, mlp_size=32, vocab_size=16, num_layers=1)
    torch.manual_seed(0)
    model = models.ToyLlama(config)
    make_inputs = lambda b: models.toy_llama_inputs(b, config, seed=b)  # noqa: E731
    built = VLLM().build(model, make_inputs, [4, 1, 8], models.SPLITTING_OPS)
    assert ("dynamic_arg_dims", {"a0": 0, "a1": 0}) in log
    assert built.capture_order == [8, 4, 1]
    assert [entry for entry in log if isinstance(entry[0], str) and entry[0] in ("NONE", "PIECEWISE")] == [
        ("NONE", None, 8),
        ("PIECEWISE", 8, 8),
        ("PIECEWISE", 4, 4),
        ("PIECEWISE", 1, 1),
    ]
    del log[:]
    with torch.no_grad():
        for batch in [3, 11, 1]:
            args = make_inputs(batch)
            torch.testing.assert_close(built(*args), model(*args))
    assert log == [("PIECEWISE", 4, 4), ("NONE", None, 11), ("PIECEWISE", 1, 1)]


def test_vllm_unavailable_reason_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)
    reason = VLLM().unavailable_reason()
    assert "vllm is not importable" in reason and "without network access" in reason
    assert adapters.IMPLEMENTATIONS["vllm"].capabilities.padding


def test_new_adapters_are_registered_with_their_contracts():
    registry = adapters.IMPLEMENTATIONS
    for name in ["dynamo-cudagraphs", "make-graphed-callables", "vllm"]:
        assert registry[name].capabilities.needs_cuda and registry[name].capabilities.cuda_graphs
    assert "instead of padding" in registry["dynamo-cudagraphs"].contracts["padding"]
    assert "no padding" in registry["make-graphed-callables"].contracts["padding"]
    assert "no CUDA graphs" in registry["eager"].contracts["cuda_graphs"]


def test_an_adapter_by_file_path(tmp_path):
    path = tmp_path / "adapter_by_path.py"
    path.write_text(
        "from pieceworks.harness.adapters import Eager\nclass Mine(Eager):\n    name = 'mine-by-path'\n"
    )
    impl = resolve(f"{path}:Mine")
    assert impl.name == "mine-by-path" and resolve(f"{path}:Mine").__class__ is impl.__class__  # loaded once
    with pytest.raises(ImportError, match="no file"):
        resolve(f"{tmp_path / 'missing.py'}:Mine")


def test_dict_outputs_are_cut_back():
    out = _cut({"a": torch.zeros(8, 2), "b": (torch.zeros(8), torch.zeros(3))}, 5, 8)
    assert out["a"].shape == (5, 2) and out["b"][0].shape == (5,) and out["b"][1].shape == (3,)


def test_hf_llama_calls_its_splitting_op_and_keeps_rows_independent():
    from pieceworks.harness.models import hf_llama as hf

    if hf.unavailable_reason():
        pytest.skip(hf.unavailable_reason())
    model = hf.hf_llama()
    (ids,) = hf.hf_llama_inputs(3, seed=1)
    graph = torch._dynamo.export(model)(ids).graph_module.graph
    assert sum("hf_llama.attention" in str(n.target) for n in graph.nodes) == 2  # one per layer
    with torch.no_grad():
        clean = model(ids)
        poisoned = ids.clone()
        poisoned[1] = hf.POISON_TOKEN
        out = model(poisoned)
    assert clean["logits"].shape == (3, hf.SEQ, 128) and clean["hidden_states"][0].shape == (3, hf.SEQ, 64)
    assert torch.isfinite(clean["logits"]).all() and out["logits"][1].isnan().all()
    torch.testing.assert_close(out["logits"][[0, 2]], clean["logits"][[0, 2]])


def test_failure_example_keeps_the_falsifying_example_and_the_message():
    text = "\n".join(
        [
            "def test(...):",
            "E   AssertionError: call 1 (batch 5): shape (8,), eager's (5,)",
            "E   Falsifying example: test_x(",
            "E       served=Built(fn=<function>,",
            "E   owner=None),",
            "E       sequence=[8, 5],",
            "E   )",
            "E   You can reproduce this example by temporarily adding @reproduce_failure('6', b'AX')",
        ]
    )
    example = failure_example(text, skip=("served",))
    assert example.splitlines() == [
        "AssertionError: call 1 (batch 5): shape (8,), eager's (5,)",
        "Falsifying example: test_x(",
        "    sequence=[8, 5],",
        ")",
        "E   You can reproduce this example by temporarily adding @reproduce_failure('6', b'AX')",
    ]


def test_failure_example_joins_an_argument_printed_over_several_lines():
    text = "\n".join(
        [
            "E   Failing explicit example: test_x(",
            "E       sequence=[1,",
            "E        2,",
            "E        3],",
            "E   )",
        ]
    )
    assert failure_example(text).splitlines() == [
        "Failing explicit example: test_x(",
        "    sequence=[1, 2, 3],",
        ")",
    ]


def _failed(message: str, text: str = "") -> types.SimpleNamespace:
    return types.SimpleNamespace(
        longrepr=types.SimpleNamespace(reprcrash=types.SimpleNamespace(message=message)), longreprtext=text
    )


def test_the_verdict_is_the_first_line_of_the_assertion_not_hypothesis_report():
    assert (
        first_line(
            _failed("AssertionError: batches [1, 2, 3]: call 2 (batch 3): rows [2] of 3 differ\nTensor-likes")
        )
        == "batches [1, 2, 3]: call 2 (batch 3): rows [2] of 3 differ"
    )
    group = (
        'AssertionError("batches [2, 2]: call 1 (batch 2): rows [0] of 2 differ\\nTensor-likes are not close!'
    )
    assert first_line(_failed(group)) == "batches [2, 2]: call 1 (batch 2): rows [0] of 2 differ"
    assert first_line(_failed("RuntimeError: boom\nmore")) == "RuntimeError: boom"
    text = "def test():\nE   ValueError: bad input\nE   Falsifying example: t(\nE   )"
    assert first_line(types.SimpleNamespace(longrepr=text, longreprtext=text)) == "ValueError: bad input"


def test_a_property_says_why_it_does_not_apply():
    from pieceworks.conformance import subjects
    from pieceworks.conformance.cases import CASES
    from pieceworks.conformance.padded_runner import PaddedRunner

    registry = adapters.IMPLEMENTATIONS
    runner, silly, writer = PaddedRunner(), CASES["silly"], CASES["silly-inplace"]

    def why(impl, case, prop, device="cpu"):
        return subjects.not_applicable(subjects.Subject(impl.name, impl, case), prop, device)

    assert why(runner, silly, "moved-inputs-never-stale") is None  # padding will do: no CUDA graph needed
    assert why(registry["eager"], silly, "moved-inputs-never-stale") == (
        "eager: runs the model eagerly: no CUDA graphs (the reference the others are compared with)"
    )
    assert why(runner, writer, "argument-writes-reach-the-caller") is None
    assert "silly model writes none of its arguments" in why(
        runner, silly, "argument-writes-reach-the-caller"
    )
    for name in ("make-graphed-callables", "meta-pcg", "vllm"):
        assert "never back" in why(registry[name], writer, "argument-writes-reach-the-caller", "cuda")
    assert "CUDA caching allocator" in why(registry["pieceworks-piecewise"], silly, "replays-grow-no-memory")
    assert why(registry["pieceworks-piecewise"], silly, "replays-grow-no-memory", "cuda") is None
    llama = subjects.Subject("eager", registry["eager"], CASES["llama"])
    assert subjects.unavailable(llama, "cpu", 64) is None
    assert "at most 64 rows" in subjects.unavailable(llama, "cpu", 65)


def test_the_table_shows_outcomes_reasons_and_failures():
    def result(impl, prop, outcome, reason=None, example=None):
        return {
            "impl": impl,
            "model": "silly",
            "property": prop,
            "outcome": outcome,
            "reason": reason,
            "example": example,
            "seconds": 0.1,
            "nodeid": f"x::{impl}-{prop}",
        }

    document = {
        "created": "T",
        "argv": ["pytest"],
        "meta": {"properties": {"p1": "", "p2": ""}, "gpu": "H100"},
        "results": [
            result("a", "p1", "pass"),
            result("a", "p2", "n/a", "a: records per size"),
            result("b", "p1", "fail", "call: shape", "Falsifying example: t(sequence=[5])"),
            result("b", "p2", "n/a", "a: records per size"),
            result("c", "p1", "unavailable", "needs vllm"),
            result("c", "p2", "unavailable", "needs vllm"),
        ],
    }
    text = conformance_table.render(document)
    assert "| a | pass | n/a [1] |" in text and "| b | **FAIL** | n/a [1] |" in text
    assert "| c | unavailable [2] |" in text and "1. a: records per size" in text and "2. needs vllm" in text
    assert "### b / silly / p1 (fail)" in text and "sequence=[5]" in text
    assert conformance_table.render(document) == text


def test_the_default_selection_is_every_implementation_on_the_three_default_models():
    from pieceworks.conformance import subjects
    from pieceworks.conformance.cases import CASES

    default = subjects.select([], [])
    assert [m for m in dict.fromkeys(s.case.name for s in default)] == list(subjects.DEFAULT_MODELS)
    assert {s.impl.name for s in default} == set(adapters.IMPLEMENTATIONS)
    assert len(default) == len(subjects.DEFAULT_MODELS) * len(adapters.IMPLEMENTATIONS)
    assert [m for m in dict.fromkeys(s.case.name for s in subjects.select(["eager"], ["all"]))] == list(CASES)
    assert {s.case.name for s in subjects.select(["eager"], ["toy-llama-tractable"])} == {
        "toy-llama-tractable"
    }
    with pytest.raises(ValueError, match="unknown conformance model.*'toy'"):
        subjects.select(["eager"], ["toy"])
    with pytest.raises(ValueError, match="unknown conformance model.*'toy'"):
        subjects.select(["eager"], ["all", "toy"])
