"""The serving record: a first call of a cached model is served without tracing, and never when anything that
changes its code has changed (its source, its attributes, its state's shapes, the call's signature)."""

from __future__ import annotations

import collections.abc
import dataclasses
import functools
import importlib.util
import os
import sys
import types

import pytest
import torch
import torch.nn as nn

import pieceworks
from pieceworks import CompilationConfig, counters
from pieceworks.harness.models import toy as models  # noqa: F401 - registers silly::attention
from pieceworks.harness.testing.scenario import run_case
from pieceworks.key import first_change
from pieceworks.model import record

pytestmark = pytest.mark.inductor


class Scaled(nn.Module):
    """A parameter, a buffer, a plain attribute the trace bakes in, the splitting op, and an argument written
    in place."""

    def __init__(self, scale: float = 2.0) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 4)
        self.register_buffer("shift", torch.ones(4))
        self.scale = scale

    def forward(self, x: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        seen.add_(1)
        h = self.linear(x) * self.scale
        out = torch.empty_like(h)
        torch.ops.silly.attention(h, h, self.shift.expand_as(h), out)
        return out - 1


def _key(model, signatures, config):
    """The model's serving-record key (`key_of(model_facts(...))`), or None where it cannot be keyed."""
    facts = record.model_facts(model, signatures, config)
    return None if facts is None else record.key_of(facts)


def _compile(model, cache_dir, **kwargs):
    return pieceworks.compile(
        model,
        CompilationConfig(
            **{
                "splitting_ops": ["silly::attention"],
                "cudagraph_mode": "NONE",
                "cache_dir": str(cache_dir),
                **kwargs,
            }
        ),
    )


def _check(compiled, model, batches=(1, 5, 3), device="cpu"):
    """Every batch as the eager model computes it, the argument written as the eager model writes it."""
    with torch.no_grad():
        for batch in batches:
            x = torch.randn(batch, 4, device=device)
            # a column: not contiguous, so the compiled model writes a copy and must copy it back
            seen, seen_eager = torch.zeros(batch, 2, device=device)[:, 0], torch.zeros(batch, device=device)
            torch.testing.assert_close(compiled(x, seen), model(x, seen_eager))
            torch.testing.assert_close(seen, seen_eager)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    """A cache holding `Scaled()`'s pieces and serving record."""
    root = tmp_path_factory.mktemp("record-cache")
    torch.manual_seed(0)
    model = Scaled()
    with counters.expect(num_dynamo_traces=1, num_traces_reused=0):
        _check(_compile(model, root), model)
    return root


def test_a_cached_model_is_served_without_tracing_or_compiling(cache_dir):
    model = Scaled()  # other weights: the record binds this model's own parameters
    with counters.expect(num_dynamo_traces=0, num_traces_reused=1, num_inductor_compiles=0):
        compiled = _compile(model, cache_dir)
        _check(compiled, model)
    with torch.no_grad():  # in-place weight loads are served, as after a traced first call
        model.linear.weight.mul_(-1)
    _check(compiled, model, batches=(2,))


def test_off_every_first_call_traces(cache_dir):
    model = Scaled()
    with counters.expect(num_dynamo_traces=1, num_traces_reused=0, num_inductor_compiles=0):
        _check(_compile(model, cache_dir, reuse_trace=False), model)


def _split_facts(compiled):
    """What the split and its analysis say about a compiled model's graph and each piece (all but the piece's
    FX graph, trace values and code), and the targets each piece has code for."""
    graph = compiled.runtime.compiled
    pieces = [dataclasses.replace(p, fx_graph=None, example_args=(), runnables={}) for p in graph.pieces]
    targets = [sorted(map(str, p.runnables)) for p in graph.pieces]
    shared = (graph.batch_symbols, graph.batch, graph.mutated_inputs, graph.restored_inputs)
    return shared, [dataclasses.astuple(p) for p in pieces], targets


def test_a_warm_start_neither_splits_nor_analyses_the_graph_again(tmp_path):
    """The record holds the split with its analysis: a warm start splits nothing (no piece seen, 0 split
    seconds) and serves the traced call's pieces, every fact of each the same, with code for the same
    targets."""
    model = Scaled()
    cold = _compile(model, tmp_path)
    _check(cold, model)
    with counters.expect(num_traces_reused=1, num_dynamo_traces=0, num_piecewise_graphs_seen=0):
        warm = _compile(model, tmp_path)
        _check(warm, model)
    assert _split_facts(warm) == _split_facts(cold)
    assert warm.runtime.compiled.build_seconds["split"] == 0 < cold.runtime.compiled.build_seconds["split"]


class Methods(Scaled):
    """`Scaled` with methods called on values inside its pieces."""

    def forward(self, x: torch.Tensor, seen: torch.Tensor) -> torch.Tensor:
        seen.add_(1)
        h = self.linear(x).mul(self.scale).relu()
        out = torch.empty_like(h)
        torch.ops.silly.attention(h, h, self.shift.expand_as(h), out)
        return out.sub(1)


def test_a_piece_keeps_the_trace_values_its_load_and_compile_read(tmp_path):
    """What the serving record pickles of a piece's trace values, each rebuilt on a warm start: its
    placeholders', those it returns and each method call's receiver's; none of the others."""
    model = Methods()
    compiled = _compile(model, tmp_path)
    _check(compiled, model)
    dropped = 0
    for piece in compiled.runtime.compiled.pieces:
        graph = piece.fx_graph.graph
        read = {*graph.find_nodes(op="placeholder"), *graph.output_node().all_input_nodes}
        read |= {node.args[0] for node in graph.find_nodes(op="call_method")}
        assert {node for node in graph.nodes if "example_value" in node.meta} == read, piece.submod_name
        dropped += len(set(graph.nodes) - read - {graph.output_node()})
    assert dropped > 0  # the model has values inside its pieces that nothing reads after the split


def test_a_piece_artifact_the_cache_lost_is_compiled_from_the_record_and_stored_again(tmp_path):
    """A warm start whose cache lost every piece's artifact is served from the record all the same: each lost
    piece is compiled from the record's split and stored, and the next start loads it."""
    model = Methods()
    _check(_compile(model, tmp_path), model)
    (folder,) = [
        d for d in os.listdir(tmp_path) if os.path.isdir(tmp_path / d / "artifacts") and d[:6] != "model-"
    ]
    for name in os.listdir(tmp_path / folder / "artifacts"):
        os.remove(tmp_path / folder / "artifacts" / name)
    lost = {"num_traces_reused": 1, "num_dynamo_traces": 0, "num_compiled_artifacts_loaded": 0}
    with counters.expect(**lost, num_inductor_compiles=2, num_compiled_artifacts_saved=2):
        _check(_compile(model, tmp_path), model)
    with counters.expect(num_traces_reused=1, num_inductor_compiles=0, num_compiled_artifacts_loaded=2):
        _check(_compile(model, tmp_path), model)


def test_a_damaged_record_is_reported_traced_and_replaced(cache_dir, caplog):
    (folder,) = [d for d in os.listdir(cache_dir) if d.startswith("model-")]
    artifacts = os.path.join(cache_dir, folder, "artifacts")
    (name,) = os.listdir(artifacts)
    path = os.path.join(artifacts, name)
    data = open(path, "rb").read()
    open(path, "wb").write(data[: len(data) // 2])
    caplog.set_level("WARNING", logger="pieceworks")
    model = Scaled()
    with counters.expect(num_dynamo_traces=1, num_traces_reused=0, num_inductor_compiles=0):
        _check(_compile(model, cache_dir), model)
    assert path in caplog.text
    with counters.expect(num_dynamo_traces=0, num_traces_reused=1):  # the trace stored a sound record again
        _check(_compile(model, cache_dir), model)


def test_a_record_that_cannot_be_rebuilt_warns_once_and_traces(cache_dir, caplog, monkeypatch):
    load = record.load  # a record that passes the cache's checks but holds a graph this torch cannot read
    monkeypatch.setattr(
        record,
        "load",
        lambda config, key, facts=None: (r := load(config, key, facts)) and r._replace(graph=b"\x80junk"),
    )
    caplog.set_level("WARNING", logger="pieceworks")
    model = Scaled()
    with counters.expect(num_dynamo_traces=1, num_traces_reused=0, num_inductor_compiles=0):
        compiled = _compile(model, cache_dir)
        _check(compiled, model)
    (warning,) = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert warning.startswith(
        "pieceworks: this model's serving record could not be used ("
    ) and warning.endswith("); tracing the model")
    assert compiled.runtime is not None and compiled.binder is not None


# Each change to what the key covers, and where `first_change` finds it (what a warm start's miss
# logs).
KEY_CHANGES = {
    "attribute": "modules.<root>.attributes.scale",
    "private attribute": "modules.<root>.attributes._scale",
    "function attribute": "modules.<root>.attributes.act",
    "parameter removed": "state.linear.bias",
    "parameter resized": "state.linear.weight.shape",
    "buffer resized": "state.shift.shape",
    "strides": "state.linear.weight.strides",
    "dtype": "state.linear.weight.dtype",
    "submodule": "modules.extra",
    "buffer": "state.extra",
    "call": "call[1]",
    "config": "config.compile_sizes",
    "default dtype": "modes.the default dtype",
    "torch version": "environment.torch",
}


@pytest.mark.parametrize("change", KEY_CHANGES)
def test_the_key_moves_with_what_changes_code_and_the_change_is_named(change, monkeypatch):
    torch.manual_seed(0)
    base = Scaled()
    config = CompilationConfig(splitting_ops=["silly::attention"])
    call = [pieceworks.model.arguments.signature(a) for a in (torch.zeros(2, 4), torch.zeros(2))]
    key, before = _key(base, call, config), record.model_facts(base, call, config)
    assert _key(Scaled(), call, config) == key, "new weights of the same shapes moved the key"
    model = Scaled()
    if change == "torch version":
        found = record.core.software_factors()
        monkeypatch.setattr(record.core, "software_factors", lambda: {**found, "torch": "9.9.9"})
    elif change == "attribute":
        model.scale = 3.0
    elif change == "private attribute":
        model._scale = 2.0
    elif change == "function attribute":
        model.act = _gelu_tanh
    elif change == "strides":  # the same shape, transposed storage
        model.linear.weight = nn.Parameter(model.linear.weight.detach().t().contiguous().t())
    elif change == "default dtype":
        monkeypatch.setattr(torch, "get_default_dtype", lambda: torch.float64)
    elif change == "parameter removed":
        model.linear = nn.Linear(4, 4, bias=False)
    elif change == "parameter resized":
        # the same name and module attributes (in/out_features), another shape
        model.linear.weight = nn.Parameter(torch.randn(8, 4))
    elif change == "buffer resized":
        model.shift = torch.ones(8)
    elif change == "dtype":
        model.half()
    elif change == "submodule":
        model.extra = nn.ReLU()
    elif change == "buffer":
        model.register_buffer("extra", torch.zeros(1))
    elif change == "call":
        call = [
            pieceworks.model.arguments.signature(a)
            for a in (torch.zeros(2, 4), torch.zeros(2, dtype=torch.int64))
        ]
    elif change == "config":
        config = CompilationConfig(splitting_ops=["silly::attention"], compile_sizes=[4])
    assert _key(model, call, config) != key
    assert first_change(before, record.model_facts(model, call, config))[0] == KEY_CHANGES[change]


def test_the_key_moves_with_the_order_of_modules_and_tensors():
    """Two models whose modules (or parameters) differ only in their order run differently: they never share a
    key."""
    config = CompilationConfig(splitting_ops=["silly::attention"])
    call = [pieceworks.model.arguments.signature(torch.zeros(2, 4))]
    ab = nn.Sequential(collections.OrderedDict(a=nn.ReLU(), b=nn.Tanh()))
    ba = nn.Sequential(collections.OrderedDict(b=nn.Tanh(), a=nn.ReLU()))
    assert _key(ab, call, config) != _key(ba, call, config)
    facts = [record.model_facts(m, call, config) for m in (ab, ba)]
    assert first_change(*facts)[0] == "order.modules[1]"


def test_a_warm_start_that_traces_again_names_what_changed(tmp_path, caplog):
    torch.manual_seed(0)
    model = Scaled()
    _check(_compile(model, tmp_path), model)
    caplog.set_level("INFO", logger="pieceworks")
    model = Scaled(scale=3.0)
    with counters.expect(num_dynamo_traces=1, num_traces_reused=0):
        _check(_compile(model, tmp_path), model)
    assert (
        "tracing the model: its serving record's key changed since the last record of Scaled was stored: "
        "modules.<root>.attributes.scale was 2.0, is 3.0"
    ) in caplog.text


def key_here() -> str | None:
    """In a process of its own: `Scaled()`'s serving-record key, as a first call in this folder has it."""
    return _key(Scaled(), [], CompilationConfig(splitting_ops=["silly::attention"]))


def test_the_same_model_started_from_another_folder_has_the_same_key(tmp_path):
    """Dynamo's configuration holds folders (`debug_dir_root`: `<working directory>/torch_compile_debug`); no
    folder enters the key, so a warm start from another folder serves the record."""
    keys = []
    for name in ("one", "two"):
        (tmp_path / name).mkdir()
        keys.append(run_case(f"{__file__}:key_here", cwd=tmp_path / name))
    assert keys[0] is not None and keys[0] == keys[1], keys


def _gelu(x):
    return torch.nn.functional.gelu(x)


def _gelu_tanh(x):
    return torch.nn.functional.gelu(x, approximate="tanh")


@pytest.mark.parametrize("what", ["function model", "forward hook", "closure", "no source file"])
def test_what_the_key_cannot_cover_gets_no_record(what):
    model = Scaled()
    if what == "function model":
        model = lambda x: x * 2  # noqa: E731 - the model under test is itself a lambda
    elif what == "forward hook":
        model.register_forward_hook(lambda module, args, out: out * 10)
    elif what == "closure":
        factor = 3.0
        model.act = lambda x: x * factor
    else:
        namespace = {"nn": nn, "__name__": "notebook_cell"}
        exec("class Cell(nn.Module):\n    def forward(self, x):\n        return x + 1\n", namespace)  # noqa: S102 - a fixed class source of the test's own, run as a notebook cell runs
        model = namespace["Cell"]()
    assert _key(model, [], CompilationConfig(splitting_ops=["silly::attention"])) is None
    functions = Scaled()
    functions.act = _gelu  # a function without a closure is keyed by its code
    assert _key(functions, [], CompilationConfig(splitting_ops=["silly::attention"])) is not None


def test_a_partial_is_keyed_by_its_function_and_bound_arguments():
    """Gemma 2's activation, `functools.partial(gelu, approximate="tanh")`: the model warm-starts, and another
    bound argument or function is another key."""
    keys = []
    for act in (
        functools.partial(torch.nn.functional.gelu, approximate="tanh"),
        functools.partial(torch.nn.functional.gelu, approximate="none"),
        functools.partial(_gelu_tanh),
    ):
        model = Scaled()
        model.act = act
        keys.append(_key(model, [], CompilationConfig(splitting_ops=["silly::attention"])))
    assert None not in keys and len(set(keys)) == 3, keys


SOURCE = """
import torch
import torch.nn as nn


class Edited(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        torch.ops.silly.attention(x, x, x, out)
        return out * FACTOR
"""


def _import(path, name, monkeypatch):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, name, module)  # Dynamo looks the module up while it traces
    spec.loader.exec_module(module)
    return module


def test_an_edited_source_file_is_traced_again(tmp_path, caplog, monkeypatch):
    """The edit changes only the code: same class name, attributes and state, so only the traced files'
    digests can tell the record is stale."""
    path = tmp_path / "edited_model.py"
    x = torch.randn(3, 4)
    for factor, traces in ((2.0, 1), (2.0, 0), (5.0, 1)):
        path.write_text(SOURCE.replace("FACTOR", repr(factor)))
        model = _import(path, "edited_model", monkeypatch).Edited()
        caplog.clear()
        caplog.set_level("INFO", logger="pieceworks")
        with counters.expect(num_dynamo_traces=traces, num_traces_reused=1 - traces):
            torch.testing.assert_close(_compile(model, tmp_path / "cache")(x), 3 * x * factor)
    assert f"{path} changed since" in caplog.text


def test_the_same_class_from_another_file_is_traced(tmp_path, monkeypatch):
    """Two projects, one module and class name each, the same structure, another constant."""
    x = torch.randn(3, 4)
    for project, factor in (("a", 2.0), ("b", 5.0)):
        (tmp_path / project).mkdir()
        path = tmp_path / project / "edited_model.py"
        path.write_text(SOURCE.replace("FACTOR", repr(factor)))
        model = _import(path, "edited_model", monkeypatch).Edited()
        with counters.expect(num_dynamo_traces=1, num_traces_reused=0):
            torch.testing.assert_close(_compile(model, tmp_path / "cache")(x), 3 * x * factor)


def test_a_file_edited_after_its_import_gives_no_record(tmp_path, caplog, monkeypatch):
    """The process runs the code it imported (2.0) while the file already says 5.0: a record of that trace
    would pair the old graph with the new file's digest."""
    path, x = tmp_path / "edited_model.py", torch.randn(3, 4)
    path.write_text(SOURCE.replace("FACTOR", "2.0"))
    model = _import(path, "edited_model", monkeypatch).Edited()
    path.write_text(SOURCE.replace("FACTOR", "5.0"))
    caplog.set_level("INFO", logger="pieceworks")
    torch.testing.assert_close(_compile(model, tmp_path / "cache")(x), 3 * x * 2.0)
    assert "changed since it was imported" in caplog.text
    model = _import(path, "edited_model", monkeypatch).Edited()
    with counters.expect(num_dynamo_traces=1, num_traces_reused=0):
        torch.testing.assert_close(_compile(model, tmp_path / "cache")(x), 3 * x * 5.0)


@pytest.mark.gpu
@pytest.mark.timeout(300)
def test_a_model_served_from_its_record_captures_and_replays_like_a_traced_one(tmp_path):
    """CUDA graphs over a record: padded batches cut back by the record's output marks, written arguments
    copied back, sizes above the largest run without graphs."""
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = Scaled()
    for traces in (1, 0):
        with counters.expect(num_dynamo_traces=traces, num_traces_reused=1 - traces):
            compiled = _compile(
                model, tmp_path, cudagraph_mode="PIECEWISE", cudagraph_capture_sizes=[1, 2, 4, 8]
            )
            _check(compiled, model, batches=(3,), device="cuda")
        compiled.capture()
        _check(compiled, model, batches=(1, 3, 5, 8, 11), device="cuda")
        assert compiled.runtime.replay_for(8, False) is not None


OUTSIDE = """
import os

import torch
import torch.nn as nn

VALUE = float(os.environ.get("PIECEWORKS_TEST_VALUE", "1"))


def _times(factor):
    def times(x):
        return x * factor
    return times


TIMES = _times(VALUE)


class ReadsOutside(nn.Module):
    SHIFT = VALUE

    def forward(self, x):
        out = torch.empty_like(x)
        torch.ops.silly.attention(x, x, x, out)
        return READ
"""
READS = {
    "module global": ("out * VALUE", "VALUE"),
    "closure": ("TIMES(out)", "TIMES.__closure__[0].cell_contents"),
    "class attribute": ("out * self.SHIFT", "type(model).SHIFT"),
}


@pytest.mark.parametrize("what", list(READS))
def test_a_value_read_outside_the_model_that_changed_is_traced_again_naming_it(
    what, tmp_path, caplog, monkeypatch
):
    """A feature flag read from the environment at import, as engines do: the same file, class and attributes
    in every process, another value. The record holds what the trace read outside the model (Dynamo's guards
    on it)."""
    read, name = READS[what]
    path, x = tmp_path / "reads_outside.py", torch.randn(3, 4)
    path.write_text(OUTSIDE.replace("READ", read))
    caplog.set_level("INFO", logger="pieceworks")
    for value, traces in (("1", 1), ("1", 0), ("2", 1), ("2", 0)):
        monkeypatch.setenv("PIECEWORKS_TEST_VALUE", value)
        model = _import(path, "reads_outside", monkeypatch).ReadsOutside()
        caplog.clear()
        with counters.expect(num_dynamo_traces=traces, num_traces_reused=1 - traces):
            torch.testing.assert_close(_compile(model, tmp_path / "cache")(x), 3 * x * float(value))
        if (value, traces) == ("2", 1):
            assert f"{name} is 2.0, the record's trace read 1.0" in caplog.text, caplog.text


CHANGES = {  # READS' values set after the first call: (the change, its name in the log)
    "module global": (lambda module: ("VALUE", module), "reads_global.VALUE"),
    "closure": (
        lambda module: ("cell_contents", module.TIMES.__closure__[0]),
        "reads_global.TIMES.__closure__[0]",
    ),
    "class attribute": (lambda module: ("SHIFT", module.ReadsOutside), "type(model).SHIFT"),
}


@pytest.mark.parametrize("start", ["traced", "record"])
@pytest.mark.parametrize("what", list(READS))
def test_a_value_read_outside_the_model_changed_in_the_process_is_traced_again_naming_it(
    what, start, tmp_path, caplog, monkeypatch
):
    """Nothing announces a module global, a closure cell or a class attribute set after the first call: the
    state watch reads the ones the trace read (Dynamo's guards) per call, whether the first call traced or was
    served from the record."""
    path, x = tmp_path / "reads_global.py", torch.randn(3, 4)
    path.write_text(OUTSIDE.replace("READ", READS[what][0]))
    module = _import(path, "reads_global", monkeypatch)
    if start == "record":
        _compile(module.ReadsOutside(), tmp_path / "cache")(x)
    compiled = _compile(module.ReadsOutside(), tmp_path / "cache")
    with counters.expect(num_traces_reused=int(start == "record")):
        compiled(x)
    caplog.set_level("WARNING", logger="pieceworks")
    (name, owner), label = CHANGES[what][0](module), CHANGES[what][1]
    monkeypatch.setattr(owner, name, 5.0)
    with counters.expect(num_dynamo_traces=1):
        torch.testing.assert_close(compiled(x), 15 * x)
    assert f"{label}" in caplog.text and "was 1.0, is 5.0 after the first call: tracing" in caplog.text, (
        caplog.text
    )
    with counters.expect(num_dynamo_traces=0):
        torch.testing.assert_close(compiled(x), 15 * x)


@pytest.mark.parametrize(
    "read", ["os.environ.get('PIECEWORKS_TEST_VALUE', '1')", "os.getenv('PIECEWORKS_TEST_VALUE', '1')"]
)
def test_an_environment_variable_read_inside_forward_gets_no_record(read, tmp_path, caplog, monkeypatch):
    """Dynamo guards `os.getenv` on nothing: a warm start could not tell another value from the trace's, so
    such a model traces in every process (named at INFO)."""
    path, x = tmp_path / "reads_environment.py", torch.randn(3, 4)
    path.write_text(OUTSIDE.replace("READ", f"out * float({read})"))
    caplog.set_level("INFO", logger="pieceworks")
    for value in ("1", "2"):
        monkeypatch.setenv("PIECEWORKS_TEST_VALUE", value)
        model = _import(path, "reads_environment", monkeypatch).ReadsOutside()
        with counters.expect(num_dynamo_traces=1, num_traces_reused=0):
            torch.testing.assert_close(_compile(model, tmp_path / "cache")(x), 3 * x * float(value))
    assert "the trace read an environment variable" in caplog.text, caplog.text


@pytest.mark.parametrize(
    "source", ["object.__getattribute__(model.linear, '__dict__')", "getattr(model.linear, '__dict__')"]
)
def test_guard_sources_as_dynamo_writes_them_are_read_back(source):
    """A guard's source in each form Dynamo writes for a read the trace made (a generic attribute read is how
    torch 2.11 reads a Hugging Face config's `__dict__`) is read back as a warm start will: the record keeps
    its value."""
    model, guard = (
        Scaled(),
        types.SimpleNamespace(name=source, guard_type="DICT_KEYS_MATCH", has_value=True, is_global=False),
    )
    assert record.outside_reads([guard], model, {}) == [
        (source, "DICT_KEYS_MATCH", sorted(vars(model.linear)))
    ]


def test_a_module_dynamo_names_by_its_id_is_read_back_by_its_import():
    """Dynamo puts some modules it reads in the frame's globals under a name holding their id in this process
    (`_<id>_c0`): the record names such a module by its import, which a warm start resolves; another value so
    named gets no record (unless its guard is one the record skips); a user's global that only looks like such
    a name is read as any global is."""

    def guard(name, kind="ID_MATCH"):
        return types.SimpleNamespace(name=name, guard_type=kind, has_value=True, is_global=True)

    reads = record.outside_reads(
        [guard(f"G['_{id(torch)}_c0'].Tensor")], Scaled(), {f"_{id(torch)}_c0": torch}
    )
    assert [r[0] for r in reads] == ["G['__import_torch'].Tensor"]
    assert record.changed_read(reads, Scaled(), {}) is None  # another process: no such global
    value = types.SimpleNamespace(x=1)
    by_id = {f"_{id(value)}_c0": value}
    with pytest.raises(record.Unkeyable, match="Dynamo names by its id"):
        record.outside_reads([guard(f"G['_{id(value)}_c0'].x")], Scaled(), by_id)
    assert record.outside_reads([guard(f"G['_{id(value)}_c0']", "TENSOR_MATCH")], Scaled(), by_id) == []
    assert record.outside_reads(
        [guard("G['scale_2_c1']", "EQUALS_MATCH")], Scaled(), {"scale_2_c1": 2.0}
    ) == [("G['scale_2_c1']", "EQUALS_MATCH", 2.0)]


def _shifted(shift):
    class Shifted(nn.Module):
        def forward(self, x):
            out = torch.empty_like(x)
            torch.ops.silly.attention(x, x, x, out)
            return out + shift

    return Shifted


def test_a_model_class_made_by_a_function_is_served_only_for_the_same_closure(tmp_path):
    x = torch.randn(3, 4)
    for shift, traces in ((1.0, 1), (1.0, 0), (5.0, 1)):
        with counters.expect(num_dynamo_traces=traces, num_traces_reused=1 - traces):
            torch.testing.assert_close(_compile(_shifted(shift)(), tmp_path)(x), 3 * x + shift)


def test_a_keyword_call_is_served_from_the_record_of_its_form(tmp_path):
    """The call's keywords are part of the key: the same form warm-starts, another form traces (its own
    record)."""
    torch.manual_seed(0)
    model = Scaled()
    for traces, call in [
        (1, lambda c, x, seen: c(x=x, seen=seen)),
        (0, lambda c, x, seen: c(seen=seen, x=x)),
        (1, lambda c, x, seen: c(x, seen)),
        (0, lambda c, x, seen: c(x, seen)),
    ]:
        compiled, x = _compile(model, tmp_path), torch.randn(3, 4)
        seen, seen_eager = torch.zeros(3), torch.zeros(3)
        with counters.expect(num_dynamo_traces=traces, num_traces_reused=1 - traces), torch.no_grad():
            torch.testing.assert_close(call(compiled, x, seen), model(x, seen_eager))
        torch.testing.assert_close(seen, seen_eager)


LIBRARY = """
def scaled(x):
    return x * 2.0
"""
USES_LIBRARY = """
import torch
import torch.nn as nn

import pwlib


class UsesLibrary(nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        torch.ops.silly.attention(x, x, x, out)
        return pwlib.scaled(out)
"""


def _distribution(site, version: str) -> None:
    info = site / "pwlib-1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: pwlib\nVersion: {version}\n")


def test_installed_library_code_is_keyed_by_its_distribution_version(tmp_path, caplog, monkeypatch):
    """A library under site-packages is known by its distribution's version, not its files' bytes: the same
    version warm-starts (an edit in place is not seen), another version traces again, naming both."""
    site = tmp_path / "lib" / "site-packages"
    (site / "pwlib").mkdir(parents=True)
    (site / "pwlib" / "__init__.py").write_text(LIBRARY)
    _distribution(site, "1.0")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.delitem(sys.modules, "pwlib", raising=False)
    (tmp_path / "uses_library.py").write_text(USES_LIBRARY)
    model, x = (
        _import(tmp_path / "uses_library.py", "uses_library", monkeypatch).UsesLibrary(),
        torch.randn(3, 4),
    )
    path = str(site / "pwlib" / "__init__.py")
    caplog.set_level("INFO", logger="pieceworks")
    for version, traces in (("1.0", 1), ("1.0", 0), ("1.1", 1), ("1.1", 0)):
        _distribution(site, version)
        # same version: not seen
        (site / "pwlib" / "__init__.py").write_text(LIBRARY + f"# {version}, {traces}\n")
        caplog.clear()
        with counters.expect(num_dynamo_traces=traces, num_traces_reused=1 - traces):
            torch.testing.assert_close(_compile(model, tmp_path / "cache")(x), 6 * x)
        if (version, traces) == ("1.1", 1):
            assert f"{path} (pwlib 1.0 then, pwlib 1.1 now) changed since" in caplog.text, caplog.text
    assert record.file_identity(path) == "pwlib 1.1"


class _Table(collections.abc.Mapping):
    """A mapping whose `get` and `__contains__` are the frozen standard library's (collections.abc)."""

    def __init__(self, data):
        self._data = data

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)


TABLE = _Table({"scale": 3.0})


@dataclasses.dataclass
class _Result:
    hidden: torch.Tensor
    note: str = "made in forward"


class FrozenAndGenerated(nn.Module):
    """Its trace runs frozen standard-library code (Mapping.get, Mapping.__contains__) and a dataclass's
    generated `__init__`, neither of which has a source file of its own."""

    def forward(self, x):
        out = torch.empty_like(x)
        torch.ops.silly.attention(x, x, x, out)
        scale = TABLE.get("scale") if "scale" in TABLE else 1.0
        return _Result(out * scale)


def test_frozen_standard_library_and_generated_code_get_a_record(tmp_path):
    x = torch.randn(3, 4)
    assert record.file_identity("<frozen _collections_abc>").startswith("frozen _collections_abc, Python ")
    for traces in (1, 0):
        with counters.expect(num_dynamo_traces=traces, num_traces_reused=1 - traces):
            out = _compile(FrozenAndGenerated(), tmp_path)(x)
        torch.testing.assert_close(out.hidden, 9 * x)
        assert out.note == "made in forward"
    config = _compile(FrozenAndGenerated(), tmp_path).config
    facts = record.model_facts(FrozenAndGenerated(), [pieceworks.model.arguments.signature(x)], config)
    files = record.load(config, record.key_of(facts), facts).files
    assert files["<frozen _collections_abc>"].startswith("frozen _collections_abc, Python "), files
