"""The model's Python state after the first call: whatever the user changes that the trace read is served by a
new trace, logged once, never by the old one; a call with grad on and an input that requires grad is refused.

Every change here leaves parameters and buffers where they are (those are `StateReplacedError`:
test_user_faults.py) and changes the eager model's output, so a stale trace differs from eager in every
element.
"""

from __future__ import annotations

import copy
import gc
import logging
import pickle

import pytest
import torch
import torch.nn as nn

import pieceworks
from pieceworks import CompilationConfig, counters
from pieceworks.harness.models import toy as models  # noqa: F401 - registers silly::attention


class Norm(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.eps = 1e-6
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Layer(nn.Module):
    """A norm, a projection, a softmax over `heads` groups (a plain int the trace bakes into a view) and the
    splitting op."""

    def __init__(self) -> None:
        super().__init__()
        self.heads = 4
        self.norm = Norm()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(self.norm(x))
        h = h.view(h.shape[0], self.heads, -1).softmax(-1).flatten(1)
        out = torch.empty_like(h)
        torch.ops.silly.attention(h, h, h, out)
        return out + x


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = 2.0
        self.layers = nn.ModuleList([Layer(), Layer()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x) * self.scale
        return x


def _served(prepare=lambda model: None, **config):
    torch.manual_seed(0)
    model = Stack()
    prepare(model)
    compiled = pieceworks.compile(
        model,
        CompilationConfig(
            **{"splitting_ops": ["silly::attention"], "compiler": "eager", "cudagraph_mode": "NONE", **config}
        ),
    )
    x = torch.randn(5, 8)
    torch.testing.assert_close(compiled(x), model(x))
    return model, compiled, x


# what the user does after the first call -> the words the WARNING names it by
CHANGES = {
    "attribute": (lambda m: setattr(m, "scale", 3.0), "scale was set"),
    "submodule attribute": (lambda m: setattr(m.layers[0].norm, "eps", 10.0), "layers.0.norm.eps was set"),
    "attribute the trace bakes into a shape": (
        lambda m: setattr(m.layers[0], "heads", 2),
        "layers.0.heads was set",
    ),
    "forward hook on a submodule": (
        lambda m: m.layers[1].register_forward_hook(lambda mod, args, out: out * 10),
        "a forward hook was registered on layers.1",
    ),
    "forward pre-hook on the root": (
        lambda m: m.register_forward_pre_hook(lambda mod, args: (args[0] * 3,)),
        "a forward pre-hook was registered on the model",
    ),
    "forward replaced": (
        lambda m: setattr(m.layers[1], "forward", lambda x: x * 7),
        "layers.1.forward was set",
    ),
    "a layer appended to a ModuleList (add_module: no setattr)": (
        lambda m: m.layers.append(Layer()),
        "layers.2 was added",
    ),
    "bias=None": (  # no registration hook fires
        lambda m: setattr(m.layers[0].proj, "bias", None),
        "layers.0.proj.bias was set",
    ),
    "bias.data=ones(1)": (  # no setattr: the old memory is freed
        lambda m: setattr(m.layers[1].proj.bias, "data", torch.ones(1)),
        "layers.1.proj.bias was given other memory (.data =)",
    ),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_after_the_first_call_is_served_by_a_new_trace_logged_once(change, caplog):
    do, words = CHANGES[change]
    model, compiled, x = _served()
    caplog.set_level(logging.WARNING, logger="pieceworks")
    do(model)
    with counters.expect(num_dynamo_traces=1):
        torch.testing.assert_close(compiled(x), model(x))
    with counters.expect(num_dynamo_traces=0):  # traced once: the next calls are served by the new trace
        for batch in (1, 3, 5):
            y = torch.randn(batch, 8)
            torch.testing.assert_close(compiled(y), model(y))
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert words in warning and "tracing and compiling the model again" in warning, warning


def test_a_parametrization_removed_after_the_first_call_is_traced_again(caplog):
    """torch's parametrize edits the class `module.__class__` names, then sets another class on the module."""
    model, compiled, x = _served(lambda m: nn.utils.parametrizations.weight_norm(m.layers[0].proj))
    caplog.set_level(logging.WARNING, logger="pieceworks")
    nn.utils.parametrize.remove_parametrizations(model.layers[0].proj, "weight")
    assert not nn.utils.parametrize.is_parametrized(model.layers[0].proj)
    with counters.expect(num_dynamo_traces=1):
        torch.testing.assert_close(compiled(x), model(x))
    assert "after the first call: tracing and compiling the model again" in caplog.text


class Shifted(nn.Module):
    """The splitting op, then a tensor made in `forward`: it takes the default dtype."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        torch.ops.silly.attention(x, x, x, out)
        return out + torch.ones(x.shape[-1])


def test_global_modes_changed_after_the_first_call_are_traced_for_never_served_stale(caplog):
    """Autocast entered after the first call, left again, the default dtype set: each call computes what eager
    computes under its own modes (its output's dtype included), one trace per change, each logged."""
    model, compiled, x = _served()
    caplog.set_level(logging.WARNING, logger="pieceworks")
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16), counters.expect(num_dynamo_traces=1):
            got, expected = compiled(x), model(x)
        torch.testing.assert_close(got, expected)  # the projection in bfloat16, as eager runs it
        with counters.expect(num_dynamo_traces=1):
            assert compiled(x).dtype == model(x).dtype == torch.float32
        shifted = Shifted()
        config = CompilationConfig(
            splitting_ops=["silly::attention"], compiler="eager", cudagraph_mode="NONE"
        )
        compiled = pieceworks.compile(shifted, config)
        compiled(x)
        try:
            torch.set_default_dtype(torch.float64)
            with counters.expect(num_dynamo_traces=1):
                got, expected = compiled(x), shifted(x)
        finally:
            torch.set_default_dtype(torch.float32)
        assert got.dtype == expected.dtype == torch.float64
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert [w.split(" after")[0] for w in warnings] == [
        "pieceworks: CPU autocast was False, is True",
        "pieceworks: CPU autocast was True, is False",
        "pieceworks: the default dtype was torch.float32, is torch.float64",
    ], warnings


def test_a_torch_function_mode_entered_after_the_first_call_is_traced_for(caplog):
    """`torch.device(...)` as a context (and `torch.set_default_device`) is a torch function mode: the factory
    calls a trace makes follow it, so a call under one is traced for (here one whose results are the same)."""
    model, compiled, x = _served()
    caplog.set_level(logging.WARNING, logger="pieceworks")
    with torch.device("cpu"), counters.expect(num_dynamo_traces=1):
        torch.testing.assert_close(compiled(x), model(x))
    with counters.expect(num_dynamo_traces=1):  # and left
        torch.testing.assert_close(compiled(x), model(x))
    warning = next(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert "torch function modes (torch.device, set_default_device) was 0, is 1" in warning


def test_a_compiled_bound_forward_watches_its_module():
    """`pieceworks.compile(model.forward)`: the bound method's module is watched as the model would be."""
    torch.manual_seed(0)
    model = Stack()
    config = CompilationConfig(splitting_ops=["silly::attention"], compiler="eager", cudagraph_mode="NONE")
    compiled, x = pieceworks.compile(model.forward, config), torch.randn(5, 8)
    torch.testing.assert_close(compiled(x), model(x))
    model.scale = 3.0
    with counters.expect(num_dynamo_traces=1):
        torch.testing.assert_close(compiled(x), model(x))


def test_a_compiled_model_is_not_pickled_or_copied_naming_the_fix():
    """It holds compiled code and CUDA graphs; the model itself pickles and copies (above)."""
    _, compiled, _ = _served()
    for copied in (pickle.dumps, copy.deepcopy, copy.copy):
        with pytest.raises(
            TypeError, match="pieceworks: a CompiledModel cannot be pickled. Fix: compile a copy"
        ):
            copied(compiled)


def test_a_model_class_whose_forward_is_replaced_after_the_first_call_is_served_by_a_new_trace(
    monkeypatch, caplog
):
    """The class is as much the model as its instance: `Layer.forward = f` is seen at the next call."""
    model, compiled, x = _served()
    caplog.set_level(logging.WARNING, logger="pieceworks")
    monkeypatch.setattr(Layer, "forward", lambda self, x: self.proj(x) * 7)
    with counters.expect(num_dynamo_traces=1):
        torch.testing.assert_close(compiled(x), model(x))
    # the first WARNING; then another says the new forward calls no splitting op
    warning = next(r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING)
    assert "Layer.forward was" in warning and "tracing and compiling the model again" in warning, warning


def test_a_hook_the_trace_ran_that_is_removed_is_served_by_a_new_trace():
    torch.manual_seed(0)
    model = Stack()
    handle = model.layers[0].register_forward_hook(lambda mod, args, out: out * 10)
    compiled = pieceworks.compile(
        model, CompilationConfig(splitting_ops=["silly::attention"], compiler="eager", cudagraph_mode="NONE")
    )
    x = torch.randn(4, 8)
    torch.testing.assert_close(compiled(x), model(x))
    handle.remove()
    with counters.expect(num_dynamo_traces=1):
        torch.testing.assert_close(compiled(x), model(x))


def test_values_set_again_unchanged_and_in_place_loads_trace_nothing():
    model, compiled, x = _served()
    model.scale = 2.0  # the same value again
    model.train()  # already in training mode
    model.load_state_dict({k: v * 0.5 for k, v in model.state_dict().items()})  # in place
    with counters.expect(num_dynamo_traces=0):
        torch.testing.assert_close(compiled(x), model(x))


def test_a_replaced_parameter_still_raises_after_an_attribute_change():
    model, compiled, x = _served()
    model.scale = 3.0
    model.layers[0].proj.weight = nn.Parameter(torch.ones(8, 8))
    with pytest.raises(
        pieceworks.StateReplacedError, match=r"^layers\.0\.proj\.weight of the compiled model"
    ):
        compiled(x)


class _GlobalTensorAndCounter(nn.Module):
    """Reads a tensor that is neither an argument nor its state (calls go through Dynamo) and counts its calls
    in an attribute (a side effect Dynamo's code repeats on every call)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        out = torch.empty_like(x)
        torch.ops.silly.attention(x, x, x, out)
        return out * _OFFSET


_OFFSET = torch.tensor(3.0)


def test_calls_through_dynamo_that_set_attributes_trace_once():
    model = _GlobalTensorAndCounter()
    compiled = pieceworks.compile(
        model, CompilationConfig(splitting_ops=["silly::attention"], compiler="eager", cudagraph_mode="NONE")
    )
    x = torch.randn(3, 4)
    with counters.expect(num_dynamo_traces=1):
        for _ in range(4):
            torch.testing.assert_close(compiled(x), x * 3 * 3)
    assert compiled.binder is None, "the model should be served through Dynamo"


def _hook(module, args, out):
    return out + 1 if isinstance(out, torch.Tensor) else out


def test_global_module_forward_hooks_are_refused_naming_the_fix():
    """A global forward hook runs on every nn.Module's call, the compiled model's own graph modules included:
    refused at any call while one is registered, served again once it is removed."""
    register = torch.nn.modules.module.register_module_forward_hook
    handle = register(_hook)
    try:
        model, compiled = Stack(), None
        compiled = pieceworks.compile(
            model,
            CompilationConfig(splitting_ops=["silly::attention"], compiler="eager", cudagraph_mode="NONE"),
        )
        with pytest.raises(pieceworks.GlobalHookError, match=r"register_module_forward_hook.*Fix: .*remove"):
            compiled(torch.randn(3, 8))
    finally:
        handle.remove()
    model, compiled, x = _served()
    handle = register(_hook)
    try:
        with pytest.raises(pieceworks.GlobalHookError):
            compiled(x)
    finally:
        handle.remove()
    torch.testing.assert_close(compiled(x), model(x))


def test_a_watched_model_keeps_its_classes_for_pickle_and_copies_and_gets_them_back():
    model, compiled, x = _served()
    assert isinstance(model.layers[0], Layer) and type(model.layers[0]).__qualname__ == "Layer"
    for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):  # noqa: S301 - loads the bytes it just pickled from its own model
        assert type(copied) is Stack and type(copied.layers[0].norm) is Norm
        torch.testing.assert_close(copied(x), model(x))
    del compiled
    gc.collect()
    assert type(model) is Stack and type(model.layers[0].norm) is Norm and type(model.layers) is nn.ModuleList


def test_a_call_with_grad_on_and_an_input_that_requires_grad_is_refused_naming_the_fix():
    model, compiled, x = _served()
    wants_grad = x.clone().requires_grad_()
    expected = model(x)  # grad off (the suites' default)
    with torch.enable_grad():
        with pytest.raises(
            pieceworks.InputError, match=r"argument 0 requires grad.*Fix: .*torch\.no_grad\(\)"
        ):
            compiled(wants_grad)
        torch.testing.assert_close(compiled(x), expected)  # no argument requires grad: served
    torch.testing.assert_close(compiled(wants_grad), expected)  # grad off: served


def test_a_parametrization_after_the_first_call_is_served_by_a_new_trace():
    """torch's parametrize deletes the parameter and swaps the module's class: neither replaces a tensor."""
    model, compiled, x = _served()
    torch.nn.utils.parametrize.register_parametrization(model.layers[0].proj, "weight", _Doubled())
    with counters.expect(num_dynamo_traces=1):
        torch.testing.assert_close(compiled(x), model(x))


class _Doubled(nn.Module):
    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight * 2


def test_torch_compile_of_the_same_model_traces_nothing_again():
    """The benchmarks build torch.compile peers on the model pieceworks serves: the marker torch.compile sets
    on it changes nothing the trace read."""
    model, compiled, x = _served()
    torch.compile(model, backend="eager")
    model.compile(backend="eager")
    with counters.expect(num_dynamo_traces=0):
        torch.testing.assert_close(compiled(x), model(x))


FILL = 2  # a module global whose type the trace bakes in: torch.full's dtype follows it


class Fills(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        torch.ops.silly.attention(x, x, x, out)
        return torch.full((x.shape[0],), FILL) + out.sum(-1).to(torch.int64)


def test_a_module_global_set_to_an_equal_value_of_another_type_is_traced_again(monkeypatch):
    """`2 == 2.0`, but not to a trace: the state watch compares each global's type too."""
    config = CompilationConfig(splitting_ops=["silly::attention"], compiler="eager", cudagraph_mode="NONE")
    model, x = Fills(), torch.zeros(3, 4)
    compiled = pieceworks.compile(model, config)
    assert compiled(x).dtype == torch.int64
    monkeypatch.setitem(globals(), "FILL", 2.0)
    with counters.expect(num_dynamo_traces=1):
        got = compiled(x)
    assert got.dtype == model(x).dtype == torch.float32
