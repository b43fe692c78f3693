"""The new-user sweep: what a new user tries on a compiled model, each try judged against eager.

`python -m suites.new_user_sweep` (CPU, under two minutes) runs every try of `TRIES` and prints a line each
and the totals; it exits 1 where a try gave a silent difference or a crash from inside torch, or another
outcome than it declares. `suites/test_new_user_sweep.py` runs it in the test suite. A try does something
to a compiled model, its arguments, the process, the config or the cache (after the first call, where it says
so), then calls the eager and the compiled model alike; its outcome is

- `right`: the compiled call gives eager's output (or raises eager's exception type);
- `refused`: it raises an error that names pieceworks' problem and fix (a pieceworks error class, or a
  message naming pieceworks), where eager may run;
- `silent`: another output than eager's, without an error;
- `crash`: any other exception (from inside torch, say).

Every try declares the outcome it must have (`right` or `refused`): the sweep fails on any other.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import glob
import os
import pathlib
import pickle
import shutil
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn as nn

import pieceworks
from pieceworks import CompilationConfig
from pieceworks.conformance.checks import assert_same
from pieceworks.harness.models import toy  # noqa: F401 - registers silly::attention

GAIN = 1.0  # a module global `Layer.forward` reads
FOLDERS: list[str] = []  # the run's temporary folder (`main`), where the tries that need a cache keep theirs


def folder(name: str = "shared") -> str:
    """A path in the run's temporary folder (the tries that compile with Inductor share `shared`)."""
    return os.path.join(FOLDERS[-1], name)


def gelu(x: torch.Tensor) -> torch.Tensor:  # a module-level helper `Layer.forward` calls
    return torch.nn.functional.gelu(x)


class Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.eps, self.heads = 1e-6, 4
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))
        h = gelu(h.view(h.shape[0], self.heads, -1).softmax(-1).flatten(1)) * GAIN
        out = torch.empty_like(h)
        torch.ops.silly.attention(h, h, h, out)
        return out + x


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = 2.0
        self.layers = nn.ModuleList([Layer(), Layer()])
        self.register_buffer("shift", torch.linspace(-1, 1, 8))

    def forward(self, x: torch.Tensor, factor: float = 1.0) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x) * self.scale
        return x * factor + self.shift


class Branches(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        torch.ops.silly.attention(x, x, x, out)
        return out * 2 if x.shape[0] > 8 else out


class ReadsEnvironment(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        torch.ops.silly.attention(x, x, x, out)
        return out * float(os.getenv("PIECEWORKS_SWEEP_VALUE", "1"))


@dataclasses.dataclass
class Setup:
    """A try's model, its compiled model (first called with `x`) and the config it was compiled with."""

    model: nn.Module
    compiled: Any
    x: torch.Tensor
    config: CompilationConfig


def config(**fields: Any) -> CompilationConfig:
    return CompilationConfig(
        **{"splitting_ops": ["silly::attention"], "compiler": "eager", "cudagraph_mode": "NONE", **fields}
    )


def served(model: nn.Module | None = None, first: int = 5, **fields: Any) -> Setup:
    """`model` (default `Model()`, seed 0) compiled and called once with a batch of `first` rows."""
    torch.manual_seed(0)
    model, frozen = Model() if model is None else model, config(**fields)
    setup = Setup(model, pieceworks.compile(model, frozen), torch.randn(first, 8), frozen)
    with torch.no_grad():
        setup.compiled(setup.x)
    return setup


@dataclasses.dataclass
class Try:
    """`run()` returns (eager call, compiled call): each a callable of no arguments, called in that order."""

    name: str
    area: str
    expect: str  # "right" or "refused"
    run: Callable[[], tuple[Callable[[], Any], Callable[[], Any]]]


TRIES: list[Try] = []


def attempt(area: str, expect: str = "right") -> Callable:
    def register(fn: Callable) -> Callable:
        TRIES.append(Try(fn.__name__.replace("_", " "), area, expect, fn))
        return fn

    return register


def after_first_call(change: Callable[[Setup], Any], batch: int = 3, **fields: Any) -> tuple:
    """The eager and compiled calls of a batch of `batch` rows after `change(setup)`."""
    s = served(**fields)
    change(s)
    y = torch.randn(batch, 8)
    return (lambda: s.model(y)), (lambda: s.compiled(y))


@contextlib.contextmanager
def patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


def calls(s: Setup) -> tuple:
    """The eager and the compiled call of `s`'s first-call argument."""
    return (lambda: s.model(s.x)), (lambda: s.compiled(s.x))


def within(context: Callable[[], Any], eager: Callable[[], Any], compiled: Callable[[], Any]) -> tuple:
    """`eager` and `compiled`, each called inside a `context()` of its own."""

    def inside(fn: Callable[[], Any]) -> Callable[[], Any]:
        def call() -> Any:
            with context():
                return fn()

        return call

    return inside(eager), inside(compiled)


# ---- the model's state after the first call --------------------------------------------------------------
for _name, _change in {
    "an attribute set": lambda s: setattr(s.model, "scale", 3.0),
    "an attribute set to the same value": lambda s: setattr(s.model, "scale", 2.0),
    "a submodule's attribute set": lambda s: setattr(s.model.layers[0], "eps", 10.0),
    "an attribute baked into a view set": lambda s: setattr(s.model.layers[1], "heads", 2),
    "train mode": lambda s: s.model.train(),
    "a forward hook registered": lambda s: s.model.layers[0].register_forward_hook(lambda m, a, o: o * 10),
    "a forward pre-hook registered": lambda s: s.model.register_forward_pre_hook(lambda m, a: (a[0] * 3,)),
    "an instance's forward replaced": lambda s: setattr(s.model.layers[1], "forward", lambda x: x * 7),
    "weights loaded in place": lambda s: s.model.load_state_dict(
        {k: torch.randn_like(v) for k, v in s.model.state_dict().items()}
    ),
    "a parameter copied into": lambda s: s.model.layers[0].proj.weight.data.mul_(3),
    "a buffer written in place": lambda s: s.model.shift.add_(5),
    "a submodule's parameters reinitialised in place": lambda s: s.model.layers[1].proj.reset_parameters(),
    "deterministic algorithms on": lambda s: torch.use_deterministic_algorithms(True),
    "a weight parametrized": lambda s: torch.nn.utils.parametrize.register_parametrization(
        s.model.layers[0].proj, "weight", _Double()
    ),
}.items():

    def _state_try(change: Callable = _change) -> tuple:
        try:
            return after_first_call(change)
        finally:
            torch.use_deterministic_algorithms(False)

    TRIES.append(Try(_name, "model state", "right", _state_try))


class _Double(nn.Module):
    def forward(self, w: torch.Tensor) -> torch.Tensor:
        return w * 2


for _name, _change in {
    "a parameter replaced": lambda s: setattr(
        s.model.layers[0].proj, "weight", nn.Parameter(torch.ones(8, 8))
    ),
    "weights loaded with assign=True": lambda s: s.model.load_state_dict(s.model.state_dict(), assign=True),
    "the model moved to float64": lambda s: s.model.double(),
    "a submodule replaced": lambda s: setattr(s.model.layers[0], "proj", nn.Linear(8, 8)),
}.items():
    TRIES.append(Try(_name, "model state", "refused", lambda change=_change: after_first_call(change)))


@attempt("model state")
def a_hook_the_trace_ran_removed() -> tuple:
    torch.manual_seed(0)
    model = Model()
    handle = model.layers[0].register_forward_hook(lambda m, a, o: o + 1)
    s = served(model)
    handle.remove()
    return calls(s)


@attempt("model state")
def the_class_forward_replaced() -> tuple:
    return within(lambda: patched(Layer, "forward", lambda self, x: self.proj(x) * 7), *calls(served()))


@contextlib.contextmanager
def _global_forward_hook() -> Iterator[None]:
    handle = torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: o)
    try:
        yield
    finally:
        handle.remove()


@attempt("model state", "refused")
def a_global_forward_hook_registered() -> tuple:
    return within(_global_forward_hook, *calls(served()))


# ---- what the process holds: globals, modes, the environment ----------------------------------------------
def _global_set(name: str, value: Any) -> Callable[[], Any]:
    """A context in which this module's global `name` is `value`."""
    return lambda: patched(sys.modules[__name__], name, value)


@attempt("process")
def a_module_global_changed() -> tuple:
    return within(_global_set("GAIN", 5.0), *calls(served()))


@attempt("process")
def a_module_level_helper_replaced() -> tuple:
    return within(_global_set("gelu", torch.tanh), *calls(served()))


@attempt("process")
def autocast_entered_after_the_first_call() -> tuple:
    return within(lambda: torch.autocast("cpu", dtype=torch.bfloat16), *calls(served()))


@attempt("process")
def the_first_call_made_under_autocast() -> tuple:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        s = served()
    return calls(s)


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


@attempt("process")
def the_default_dtype_set() -> tuple:
    return within(lambda: _default_dtype(torch.float64), *calls(served(model=ReadsDefaultDtype())))


class ReadsDefaultDtype(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        torch.ops.silly.attention(x, x, x, out)
        return out + torch.ones(x.shape[-1])


@contextlib.contextmanager
def _environment(value: str) -> Iterator[None]:
    os.environ["PIECEWORKS_SWEEP_VALUE"] = value
    try:
        yield
    finally:
        del os.environ["PIECEWORKS_SWEEP_VALUE"]


@attempt("process")
def an_environment_variable_read_in_forward_changed_in_a_warm_start() -> tuple:
    with _environment("1"):
        served(model=ReadsEnvironment(), cache_dir=folder(), compiler="inductor")
    torch._dynamo.reset()
    model, x = ReadsEnvironment(), torch.randn(5, 8)
    compiled = pieceworks.compile(model, config(cache_dir=folder(), compiler="inductor"))
    return within(lambda: _environment("6"), lambda: model(x), lambda: compiled(x))


# ---- inputs -----------------------------------------------------------------------------------------------
def _call(args: Callable[[], tuple], kwargs: Callable[[], dict] | None = None, **fields: Any) -> tuple:
    s = served(**fields)
    a, k = args(), (kwargs or dict)()
    return (lambda: s.model(*a, **k)), (lambda: s.compiled(*a, **k))


for _name, (_args, _expect) in {
    "batch 1 after a first call of 5": (lambda: (torch.randn(1, 8),), "right"),
    "batch 1000": (lambda: (torch.randn(1000, 8),), "right"),
    "a transposed argument": (lambda: (torch.randn(8, 7).t(),), "right"),
    "a sliced argument": (lambda: (torch.randn(6, 16)[:, ::2],), "right"),
    "NaN rows": (lambda: (torch.full((3, 8), float("nan")),), "right"),
    "float64 where the first call had float32": (
        lambda: (torch.randn(3, 8, dtype=torch.float64),),
        "refused",
    ),
    "another trailing size": (lambda: (torch.randn(3, 9),), "refused"),
    "another rank": (lambda: (torch.randn(3, 8, 1),), "refused"),
    "a 0-d tensor": (lambda: (torch.tensor(1.0),), "refused"),
    "an empty batch": (lambda: (torch.randn(0, 8),), "refused"),
    "another non-tensor value": (lambda: (torch.randn(3, 8), 2.0), "refused"),
    "an int where the first call left a float default": (lambda: (torch.randn(3, 8), 1), "refused"),
}.items():
    TRIES.append(Try(_name, "inputs", _expect, lambda args=_args: _call(args)))


@attempt("inputs")
def a_keyword_call_after_a_positional_one() -> tuple:
    return _call(tuple, lambda: {"x": torch.randn(3, 8)})


@attempt("inputs", "refused")
def a_keyword_forward_does_not_take() -> tuple:
    return _call(lambda: (torch.randn(3, 8),), lambda: {"y": 1})


@attempt("inputs, grad on", "refused")
def an_argument_that_requires_grad_with_grad_on() -> tuple:
    s = served()
    x = torch.randn(3, 8, requires_grad=True)
    return (lambda: s.model(x)), (lambda: s.compiled(x))


@attempt("inputs", "refused")
def a_batch_on_another_branch_than_the_trace() -> tuple:
    s = served(model=Branches())
    y = torch.randn(12, 8)
    return (lambda: s.model(y)), (lambda: s.compiled(y))


# ---- threads ----------------------------------------------------------------------------------------------
@attempt("threads")
def first_calls_from_four_threads() -> tuple:
    torch.manual_seed(0)
    model = Model()
    compiled = pieceworks.compile(model, config())
    inputs = [torch.randn(b, 8) for b in (2, 3, 5, 7)]

    def threaded(fn: Callable) -> Callable:
        def run() -> Any:
            results: dict[int, Any] = {}
            start = threading.Barrier(len(inputs))

            def call(k: int) -> None:
                start.wait()
                with torch.no_grad():
                    results[k] = fn(inputs[k])

            threads = [threading.Thread(target=call, args=(k,)) for k in range(len(inputs))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if len(results) < len(inputs):
                raise RuntimeError("a thread's call raised")
            return torch.cat([results[k] for k in range(len(inputs))])

        return run

    return threaded(model), threaded(compiled)


# ---- config and torch.compile ---------------------------------------------------------------------------
def _refused_at_build(build: Callable[[], Any]) -> tuple:
    return (lambda: None), build


@attempt("config", "refused")
def an_unknown_inductor_option() -> tuple:
    return _refused_at_build(lambda: config(inductor_compile_config={"max_autotun": True}))


@attempt("config", "refused")
def an_inductor_option_of_another_type() -> tuple:
    return _refused_at_build(lambda: config(inductor_compile_config={"max_autotune": "yes"}))


@attempt("config", "refused")
def a_misspelt_splitting_op() -> tuple:
    def build() -> Any:
        compiled = pieceworks.compile(Model(), config(splitting_ops=["silly::atention"]))
        return compiled(torch.randn(3, 8))

    return (lambda: None), build


@attempt("config", "refused")
def a_config_field_set_after_compiling() -> tuple:
    s = served()
    return (lambda: None), (lambda: setattr(s.config, "compile_sizes", [4]))


@attempt("config", "refused")
def compiling_a_compiled_model() -> tuple:
    s = served()
    return (lambda: None), (lambda: pieceworks.compile(s.compiled))


@attempt("torch.compile", "refused")
def torch_compile_with_an_inductor_mode() -> tuple:
    torch._dynamo.reset()
    model, x = Model(), torch.randn(3, 8)
    fn = torch.compile(model, backend="pieceworks", mode="reduce-overhead")
    return (lambda: model(x)), (lambda: fn(x))


@attempt("torch.compile")
def torch_compile_recompiling_for_a_changed_global() -> tuple:
    torch._dynamo.reset()
    model, x = Model(), torch.randn(3, 8)
    options = {"splitting_ops": ["silly::attention"], "compiler": "eager", "cudagraph_mode": "NONE"}
    fn = torch.compile(model, backend="pieceworks", fullgraph=True, options=options)
    with torch.no_grad():
        fn(x)
    return within(_global_set("GAIN", 3.0), lambda: model(x), lambda: fn(x))


# ---- the cache ------------------------------------------------------------------------------------------
@attempt("cache")
def a_cache_folder_holding_a_space() -> tuple:
    return _call(lambda: (torch.randn(3, 8),), cache_dir=folder("my cache"), compiler="inductor")


@attempt("cache")
def a_cache_folder_that_is_a_file() -> tuple:
    with open(path := folder("a file"), "w") as file:
        file.write("a user's file")
    return _call(lambda: (torch.randn(3, 8),), cache_dir=path, compiler="inductor")


@attempt("cache")
def a_warm_start_of_the_same_model() -> tuple:
    served(cache_dir=folder(), compiler="inductor")
    return _call(lambda: (torch.randn(3, 8),), cache_dir=folder(), compiler="inductor")


# ---- a warm start served from the serving record, then changed ----------------------------------------
def _warm_served(model: Callable[[], nn.Module] = Model) -> Setup:
    """`model()` served from its serving record in the shared cache (the try crashes where it is not)."""
    served(model(), cache_dir=folder(), compiler="inductor")
    torch._dynamo.reset()
    with pieceworks.counters.expect(num_traces_reused=1):
        return served(model(), cache_dir=folder(), compiler="inductor")


def _warm(change: Callable[[Setup], Any], model: Callable[[], nn.Module] = Model, batch: int = 3) -> tuple:
    """The eager and compiled calls of a batch of `batch` after `change`, the model served from its record."""
    s = _warm_served(model)
    change(s)
    y = torch.randn(batch, 8)
    return (lambda: s.model(y)), (lambda: s.compiled(y))


@attempt("warm start")
def an_attribute_set_after_a_warm_start() -> tuple:
    return _warm(lambda s: setattr(s.model, "scale", 3.0))


@attempt("warm start")
def a_module_global_changed_after_a_warm_start() -> tuple:
    return within(_global_set("GAIN", 4.0), *_warm(lambda s: None))


@attempt("warm start", "refused")
def a_batch_on_another_branch_after_a_warm_start() -> tuple:
    return _warm(lambda s: None, model=Branches, batch=12)


# ---- more of what a new user calls and sets --------------------------------------------------------
@attempt("inputs")
def a_first_call_of_batch_1() -> tuple:
    return calls(served(first=1))


@attempt("inputs")
def a_call_under_inference_mode() -> tuple:
    return within(torch.inference_mode, *calls(served()))


@attempt("config")
def compile_sizes_and_ranges() -> tuple:
    return _call(lambda: (torch.randn(6, 8),), compile_sizes=[4, 6], compile_ranges=[4, 64])


@attempt("config", "refused")
def a_batch_beyond_every_compile_range() -> tuple:
    return _call(lambda: (torch.randn(80, 8),), compile_ranges=[4, 64], max_num_batched_tokens=64)


@attempt("config")
def cuda_graph_modes_without_cuda() -> tuple:
    calls = [
        _call(lambda: (torch.randn(3, 8),), cudagraph_mode=mode) for mode in ("FULL", "FULL_AND_PIECEWISE")
    ]
    return (lambda: torch.cat([e() for e, _ in calls])), (lambda: torch.cat([c() for _, c in calls]))


@attempt("config", "refused")
def an_unknown_cudagraph_mode() -> tuple:
    return _refused_at_build(lambda: config(cudagraph_mode="PIECEWISE_FULL"))


@attempt("config", "refused")
def a_cache_switch_spelt_maybe() -> tuple:
    def build() -> Any:
        os.environ["PIECEWORKS_DISABLE_CACHE"] = "maybe"
        try:
            return served()
        finally:
            del os.environ["PIECEWORKS_DISABLE_CACHE"]

    return (lambda: None), build


@attempt("model state")
def a_deep_copy_of_the_model_after_compiling() -> tuple:
    s = served()
    copied = copy.deepcopy(s.model)
    return (lambda: copied(s.x)), (lambda: s.compiled(s.x))


@attempt("model state")
def the_model_pickled_and_loaded_after_compiling() -> tuple:
    s = served()
    loaded = pickle.loads(pickle.dumps(s.model))  # noqa: S301 - the bytes it just made
    return (lambda: loaded(s.x)), (lambda: s.compiled(s.x))


# ---- what else a new user writes, calls and sets -----------------------------------------------------------
class Outputs(nn.Module):
    """Model's output in the containers a forward returns, a number and None among them."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Model()

    def forward(self, x: torch.Tensor) -> Any:
        y = self.inner(x)
        return {"hidden": y, "pair": (y * 2, None), "count": 3}


@attempt("model forms")
def a_forward_returning_a_dict_a_tuple_a_number_and_none() -> tuple:
    return calls(served(model=Outputs()))


@attempt("model forms")
def a_plain_function() -> tuple:
    def fn(x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)
        torch.ops.silly.attention(x, x, x, out)
        return out.sin()

    compiled, x = pieceworks.compile(fn, config()), torch.randn(4, 8)
    return (lambda: fn(x)), (lambda: compiled(x))


@attempt("model forms", "refused")
def compiling_a_number() -> tuple:
    return (lambda: None), (lambda: pieceworks.compile(42))


@attempt("model forms")
def no_splitting_op_named() -> tuple:
    return calls(served(splitting_ops=[]))


@attempt("model forms")
def a_splitting_op_named_that_the_model_never_calls() -> tuple:
    return calls(served(splitting_ops=["silly::attention", "silly::pair"]))


for _name, _change, _expect in [
    ("eval() called again", lambda s: s.model.eval(), "right"),
    ("requires_grad_(False) on the parameters", lambda s: s.model.requires_grad_(False), "right"),
    ("parameters reinitialised in place by apply()", lambda s: s.model.apply(_reset), "right"),
    ("another torch seed", lambda s: torch.manual_seed(7), "right"),
    (
        "a buffer registered again with another tensor",
        lambda s: s.model.register_buffer("shift", torch.ones(8)),
        "refused",
    ),
    ("a layer appended to a ModuleList", lambda s: s.model.layers.append(Layer()), "right"),
    ("a layer deleted from a ModuleList", lambda s: s.model.layers.__delitem__(1), "right"),
]:
    TRIES.append(Try(_name, "model state", _expect, lambda change=_change: after_first_call(change)))


def _reset(module: nn.Module) -> None:
    if isinstance(module, nn.Linear):
        module.reset_parameters()


@attempt("calls")
def later_calls_from_another_thread() -> tuple:
    s = served()

    def in_a_thread(fn: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            found: list[Any] = []
            thread = threading.Thread(
                target=lambda: found.append(torch.no_grad()(fn)())
            )  # grad mode: per thread
            thread.start()
            thread.join()
            return found[0]

        return run

    eager, compiled = calls(s)
    return in_a_thread(eager), in_a_thread(compiled)


@attempt("calls")
def capture_called_without_cuda() -> tuple:
    s = served()
    s.compiled.capture()
    return calls(s)


@attempt("calls", "refused")
def capture_called_before_the_first_call() -> tuple:
    compiled = pieceworks.compile(Model(), config())
    return (lambda: None), compiled.capture


@attempt("calls", "refused")
def estimate_capture_called_before_the_first_call() -> tuple:
    compiled = pieceworks.compile(Model(), config())
    return (lambda: None), compiled.estimate_capture


@attempt("calls")
def many_batch_sizes_in_a_row() -> tuple:
    s, sizes = served(), [1, 2, 3, 7, 16, 33, 2, 1, 64]
    inputs = [torch.randn(b, 8) for b in sizes]
    return (lambda: torch.cat([s.model(y) for y in inputs])), (
        lambda: torch.cat([s.compiled(y) for y in inputs])
    )


@attempt("config", "refused")
def a_capture_size_of_0() -> tuple:
    return _refused_at_build(lambda: config(cudagraph_capture_sizes=[0, 4]))


@attempt("config", "refused")
def a_compile_size_above_the_batch_limit() -> tuple:
    return _refused_at_build(lambda: config(compile_sizes=[8192], max_num_batched_tokens=512))


@attempt("config", "refused")
def a_splitting_op_named_without_its_namespace() -> tuple:
    def build() -> Any:
        return pieceworks.compile(Model(), config(splitting_ops=["attention"]))(torch.randn(3, 8))

    return (lambda: None), build


# ---- what a demanding user of an inference engine passes: token ids, masks, images, views, containers ------
def attend(x: torch.Tensor) -> torch.Tensor:
    """`silly::attention(x, x, x)`: the splitting op the models below call once."""
    out = torch.empty_like(x)
    torch.ops.silly.attention(x, x, x, out)
    return out


class Tokens(nn.Module):
    """Token ids (batch, sequence) embedded, attended and projected on the embedding (tied weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.head = nn.Embedding(32, 8), nn.Linear(8, 32, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.embed(ids)
        return self.head(attend(h) + h)


class Hidden(nn.Module):
    """Hidden states of any rank, 8 features last."""

    def __init__(self) -> None:
        super().__init__()
        self.norm, self.proj = nn.LayerNorm(8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(attend(self.norm(x)))


class Image(nn.Module):
    """A (batch, channels, height, width) image through a convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return attend(self.conv(x)).relu()


class Masked(nn.Module):
    """Hidden states and a bool mask of their shape."""

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return attend(torch.where(mask, x, 0.0)) + x


class Pairwise(nn.Module):
    """One argument that holds two tensors: a tuple, or a dict as a tokenizer returns."""

    def forward(self, pair: Any) -> torch.Tensor:
        x, y = pair.values() if isinstance(pair, dict) else pair
        return attend(x) * y


class Variadic(nn.Module):
    def forward(self, *xs: torch.Tensor) -> torch.Tensor:
        return attend(xs[0]) * xs[1]


class WritesArgument(nn.Module):
    """Scales its argument in place, as a rotary embedding applied in place does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return attend(x)


def forms(
    model: Callable[[], nn.Module],
    first: Callable[[], tuple],
    later: Callable[[], tuple],
    change: Callable[[Any], Any] = lambda model: None,
) -> tuple:
    """The eager and compiled calls with `later()` of `model()` (seed 0), first called with `first()`, then
    changed by `change(model)`."""
    torch.manual_seed(0)
    built = model()
    compiled, args = pieceworks.compile(built, config()), later()
    with torch.no_grad():
        compiled(*first())
    change(built)
    return (lambda: built(*args)), (lambda: compiled(*args))


def ids(batch: int, length: int = 6, high: int = 32) -> Callable[[], tuple]:
    return lambda: (torch.randint(high, (batch, length)),)


def rows(*shape: int) -> Callable[[], tuple]:
    return lambda: (torch.randn(*shape),)


def pair(
    batch: int, container: Callable[[torch.Tensor, torch.Tensor], Any] | None = None
) -> Callable[[], tuple]:
    """One argument of two tensors of `batch` rows: `container(x, y)`, or `(x, y)`; without a container, the
    two tensors as two arguments."""

    def make() -> tuple:
        two = torch.randn(batch, 8), torch.randn(batch, 8)
        return two if container is None else (container(*two),)

    return make


def tuple_of(*tensors: torch.Tensor) -> tuple:
    return tensors


class _Subclass(torch.Tensor):
    pass


for _name, (_model, _first, _later, _expect) in {
    "token ids of another batch": (Tokens, ids(5), ids(3), "right"),
    "token ids of another sequence length": (Tokens, ids(5), ids(3, length=7), "refused"),
    "a token id beyond the vocabulary": (Tokens, ids(5), ids(3, high=99), "right"),
    "a zero-size sequence dim": (Hidden, rows(5, 0, 8), rows(3, 0, 8), "right"),
    "a channels_last image batch": (
        Image,
        rows(4, 3, 5, 5),
        lambda: (torch.randn(3, 3, 5, 5).to(memory_format=torch.channels_last),),
        "right",
    ),
    "a bool mask beside the hidden states": (
        Masked,
        lambda: (torch.randn(5, 8), torch.rand(5, 8) > 0.5),
        lambda: (torch.randn(3, 8), torch.rand(3, 8) > 0.5),
        "right",
    ),
    "a tuple of two tensors as the argument": (Pairwise, pair(5, tuple_of), pair(3, tuple_of), "refused"),
    "a dict of tensors as the argument": (
        Pairwise,
        pair(5, lambda x, y: {"x": x, "y": y}),
        pair(3, lambda x, y: {"x": x, "y": y}),
        "refused",
    ),
    "one tensor passed for two arguments": (Variadic, pair(5), lambda: (torch.randn(3, 8),) * 2, "right"),
}.items():
    TRIES.append(Try(_name, "inputs", _expect, lambda m=_model, f=_first, a=_later: forms(m, f, a)))


for _name, (_args, _expect) in {
    "a row expanded to a batch (stride 0)": (lambda: (torch.randn(1, 8).expand(3, 8),), "right"),
    "a tensor subclass as the argument": (lambda: (torch.randn(3, 8).as_subclass(_Subclass),), "right"),
    "an argument that requires grad under no_grad": (
        lambda: (torch.randn(3, 8, requires_grad=True),),
        "right",
    ),
    "a numpy array": (lambda: (torch.randn(3, 8).numpy(),), "refused"),
    "None for the optional factor": (lambda: (torch.randn(3, 8), None), "refused"),
}.items():
    TRIES.append(Try(_name, "inputs", _expect, lambda args=_args: _call(args)))


for _name, _batch in {
    "a batch of exactly a compile size": 8,
    "a batch one above the largest compile size": 9,
    "a batch far above the largest compile size": 3000,
}.items():
    TRIES.append(Try(_name, "inputs", "right", lambda b=_batch: _call(rows(b, 8), compile_sizes=[4, 8])))


@attempt("inputs, grad on")
def an_argument_that_requires_grad_under_inference_mode() -> tuple:
    return within(torch.inference_mode, *_call(lambda: (torch.randn(3, 8, requires_grad=True),)))


@attempt("inputs")
def a_first_call_with_a_transposed_argument() -> tuple:
    torch.manual_seed(0)
    model, x = Model(), torch.randn(8, 5).t()
    compiled = pieceworks.compile(model, config())
    with torch.no_grad():
        compiled(x)
    return (lambda: model(x)), (lambda: compiled(x))


@attempt("inputs")
def an_argument_forward_writes_in_place_passed_as_a_slice() -> tuple:
    model, base = WritesArgument(), torch.randn(3, 16)
    compiled = pieceworks.compile(model, config())
    with torch.no_grad():
        compiled(torch.randn(5, 8))

    def written(fn: Callable) -> Callable[[], Any]:
        def call() -> Any:  # the output, and the whole tensor the argument is a slice of
            whole = base.clone()
            return fn(whole[:, ::2]), whole

        return call

    return written(model), written(compiled)


# ---- more of the model's state and structure after the first call ------------------------------------------
for _name, _change in {
    "eval() on one submodule": lambda s: s.model.layers[1].eval(),
    "a buffer registered after the first call": lambda s: s.model.register_buffer("extra", torch.ones(8)),
    "a parameter's .data reassigned": lambda s: setattr(
        s.model.layers[0].proj.weight, "data", torch.randn(8, 8)
    ),
    "part of the weights loaded with strict=False": lambda s: s.model.load_state_dict(
        {"shift": torch.ones(8)}, strict=False
    ),
    "a bfloat16 checkpoint loaded in place": lambda s: s.model.load_state_dict(
        {k: v.bfloat16() for k, v in s.model.state_dict().items()}
    ),
}.items():
    TRIES.append(Try(_name, "model state", "right", lambda change=_change: after_first_call(change)))


class Steps(nn.Module):
    """A step counter forward adds to in place, as a KV cache's position."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("steps", torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps.add_(1)
        return attend(x) + self.steps


@attempt("model state")
def a_buffer_forward_updates_in_place() -> tuple:
    s = served(Steps())
    twin = copy.deepcopy(s.model)  # at the compiled model's step
    y = torch.randn(3, 8)
    return (lambda: torch.cat([twin(y), twin(y)])), (lambda: torch.cat([s.compiled(y), s.compiled(y)]))


@attempt("model state", "refused")
def tied_weights_untied_by_a_new_parameter() -> tuple:
    return forms(
        Tokens, ids(5), ids(3), lambda m: setattr(m.head, "weight", nn.Parameter(m.embed.weight.clone()))
    )


class Shared(nn.Module):
    """One layer in two places."""

    def __init__(self) -> None:
        super().__init__()
        self.first = Layer()
        self.second = self.first

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(self.first(x))


class Keyed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleDict({"a": Layer(), "b": Layer()})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks.values():
            x = block(x)
        return x


def _weight_normed() -> nn.Module:
    model = Model()
    nn.utils.parametrizations.weight_norm(model.layers[0].proj)
    return model


for _name, (_model, _change, _expect) in {
    "a layer appended to nn.Sequential": (
        lambda: nn.Sequential(Layer(), nn.Linear(8, 8), Layer()),
        lambda m: m.append(Layer()),
        "right",
    ),
    "a ModuleDict entry added": (Keyed, lambda m: m.blocks.update({"c": Layer()}), "right"),
    "a ModuleDict entry replaced": (Keyed, lambda m: m.blocks.update({"a": Layer()}), "refused"),
    "a layer in two places with its attribute set": (
        Shared,
        lambda m: setattr(m.first, "eps", 10.0),
        "right",
    ),
    "a weight norm's magnitude written in place": (
        _weight_normed,
        lambda m: m.layers[0].proj.parametrizations.weight.original0.data.mul_(2),
        "right",
    ),
}.items():
    TRIES.append(
        Try(_name, "model forms", _expect, lambda m=_model, c=_change: forms(m, rows(5, 8), rows(3, 8), c))
    )


# ---- more of the process: threads, flags and modes ---------------------------------------------------------
@contextlib.contextmanager
def _set(get: Callable[[], Any], set_to: Callable[[Any], Any], value: Any) -> Iterator[None]:
    old = get()
    set_to(value)
    try:
        yield
    finally:
        set_to(old)


for _name, _context in {
    "one intra-op thread": lambda: _set(torch.get_num_threads, torch.set_num_threads, 1),
    "TF32 matmuls allowed": lambda: patched(torch.backends.cuda.matmul, "allow_tf32", True),
    "oneDNN turned off": lambda: torch.backends.mkldnn.flags(enabled=False),
    "float32 matmul precision medium": lambda: _set(
        torch.get_float32_matmul_precision, torch.set_float32_matmul_precision, "medium"
    ),
}.items():
    TRIES.append(Try(_name, "process", "right", lambda c=_context: within(c, *calls(served()))))


@attempt("process")
def the_first_call_made_under_inference_mode() -> tuple:
    torch.manual_seed(0)
    model = Model()
    with torch.inference_mode():
        s = served(model)
    return calls(s)


@attempt("process")
def a_model_built_under_inference_mode() -> tuple:
    with torch.inference_mode():
        torch.manual_seed(0)
        model = Model()
    return calls(served(model))


@attempt("threads")
def a_first_call_in_a_worker_thread_later_calls_in_the_main_thread() -> tuple:
    torch.manual_seed(0)
    model, y = Model(), torch.randn(3, 8)
    compiled = pieceworks.compile(model, config())
    thread = threading.Thread(target=torch.no_grad()(lambda: compiled(torch.randn(5, 8))))
    thread.start()
    thread.join()
    return (lambda: model(y)), (lambda: compiled(y))


@attempt("threads")
def two_compiled_models_called_at_once_from_two_threads() -> tuple:
    torch.manual_seed(0)
    models, ys = [Model(), Model()], [torch.randn(3, 8), torch.randn(4, 8)]
    compiled = [pieceworks.compile(m, config()) for m in models]

    def both(fns: list[Callable]) -> Callable[[], Any]:
        def run() -> Any:
            results: dict[int, Any] = {}
            start = threading.Barrier(2)

            def call(k: int) -> None:
                start.wait()
                with torch.no_grad():
                    results[k] = [fns[k](ys[k]) for _ in range(3)]

            threads = [threading.Thread(target=call, args=(k,)) for k in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            return [results[0], results[1]]

        return run

    return both(models), both(compiled)


@attempt("calls")
def two_compiled_models_of_one_class_called_in_turn() -> tuple:
    torch.manual_seed(0)
    models, y = [Model(), Model()], torch.randn(3, 8)
    compiled = [pieceworks.compile(m, config()) for m in models]
    with torch.no_grad():
        for c in compiled:
            c(torch.randn(5, 8))
    return (lambda: torch.cat([m(y) for m in models])), (lambda: torch.cat([c(y) for c in compiled]))


@attempt("calls")
def one_model_compiled_twice() -> tuple:
    s = served()
    again, y = pieceworks.compile(s.model, config()), torch.randn(3, 8)
    return (lambda: torch.cat([s.model(y), s.model(y)])), (lambda: torch.cat([again(y), s.compiled(y)]))


# ---- more config and torch.compile ------------------------------------------------------------------------
for _name, _fields in {
    "compile ranges out of order": {"compile_ranges": [64, 4]},
    "the compiler spelt Inductor": {"compiler": "Inductor"},
    "splitting_ops as one string": {"splitting_ops": "silly::attention"},
    "an Inductor option holding a function": {
        "inductor_compile_config": {"post_grad_custom_post_pass": print}
    },
}.items():
    TRIES.append(Try(_name, "config", "refused", lambda f=_fields: _refused_at_build(lambda: config(**f))))


@attempt("config", "refused")
def a_dict_in_place_of_a_config() -> tuple:
    return _refused_at_build(lambda: pieceworks.compile(Model(), {"compiler": "eager"}))


@attempt("config")
def compile_sizes_from_the_capture_sizes_shorthand() -> tuple:
    shorthand = {"compile_sizes": ["cudagraph_capture_sizes"], "cudagraph_capture_sizes": [1, 2, 4]}
    return _call(rows(4, 8), **shorthand)


@attempt("config")
def the_cache_folder_as_a_pathlib_path() -> tuple:
    return _call(rows(3, 8), cache_dir=pathlib.Path(folder()), compiler="inductor")


@attempt("config", "refused")
def max_num_batched_tokens_of_1_with_a_first_call_of_1() -> tuple:
    return _call(rows(1, 8), first=1, max_num_batched_tokens=1)


OPTIONS = {"splitting_ops": ["silly::attention"], "compiler": "eager", "cudagraph_mode": "NONE"}


def _torch_compiled(model: nn.Module, sizes: tuple = (3,), **kwargs: Any) -> tuple:
    """The eager and `torch.compile(model, backend="pieceworks", **kwargs)` calls of batches of `sizes`."""
    fn, inputs = torch.compile(model, backend="pieceworks", **kwargs), [torch.randn(b, 8) for b in sizes]
    return (lambda: [model(y) for y in inputs]), (lambda: [fn(y) for y in inputs])


class GraphBreak(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = attend(x).sin()
        torch._dynamo.graph_break()
        return attend(y) * 2


@attempt("torch.compile")
def dynamic_true_over_three_batch_sizes() -> tuple:
    return _torch_compiled(Model(), (3, 5, 17), dynamic=True, options=OPTIONS)


@attempt("torch.compile")
def a_graph_break_without_fullgraph() -> tuple:
    return _torch_compiled(GraphBreak(), (3, 4), options=OPTIONS)


@attempt("torch.compile", "refused")
def an_option_pieceworks_does_not_have() -> tuple:
    return _torch_compiled(Model(), options={**OPTIONS, "max_autotune": True})


@attempt("torch.compile")
def module_compile_in_place() -> tuple:
    torch.manual_seed(0)
    model, y = Model(), torch.randn(3, 8)
    twin = copy.deepcopy(model)
    model.compile(backend="pieceworks", options=OPTIONS)
    return (lambda: twin(y)), (lambda: model(y))


# ---- cache damage: a copy of the shared cache broken, then a warm start from it ----------------------------
def _copy_of_shared() -> str:
    """A copy of the shared cache, which holds `Model`'s pieces and serving record."""
    served(cache_dir=folder(), compiler="inductor")
    torch._dynamo.reset()
    return shutil.copytree(folder(), folder(f"copy-{len(os.listdir(FOLDERS[-1]))}"))


def _each(pattern: str, damage: Callable[[str], Any]) -> Callable[[], tuple]:
    """The eager and compiled calls of `Model` served from a copy of the shared cache in which `damage` broke
    every path `pattern` matches."""

    def run() -> tuple:
        copied = _copy_of_shared()
        found = glob.glob(os.path.join(copied, pattern))
        if not found:
            raise FileNotFoundError(f"no {pattern} in {copied}")
        for path in found:
            damage(path)
        return _call(rows(3, 8), cache_dir=copied, compiler="inductor")

    return run


def _truncate(path: str) -> None:
    os.truncate(path, os.path.getsize(path) // 2)


def _garble(path: str) -> None:
    with open(path, "r+b") as file:
        file.write(b"{garbage")


def _junk(folder_path: str) -> None:
    for name in ("junk.bin", ".tmp-junk", "index.json~"):
        with open(os.path.join(folder_path, name), "wb") as file:
            file.write(b"junk")


def _file_instead(path: str) -> None:
    shutil.rmtree(path)
    with open(path, "w") as file:
        file.write("a user's file")


for _name, (_pattern, _damage) in {
    "every compiled artifact truncated": ("[0-9a-f]*/artifacts/*.bin", _truncate),
    "the artifacts' index garbled": ("[0-9a-f]*/index.json", _garble),
    "the serving record truncated": ("model-*/artifacts/*.bin", _truncate),
    "garbage files in every cache folder": ("*/*/", _junk),
    "the artifacts folder replaced by a file": ("[0-9a-f]*/artifacts", _file_instead),
    "every compiled artifact deleted": ("[0-9a-f]*/artifacts/*.bin", os.unlink),
}.items():
    TRIES.append(Try(_name, "cache", "right", _each(_pattern, _damage)))


@contextlib.contextmanager
def _variable(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        os.environ.pop(name) if old is None else os.environ.update({name: old})


@attempt("cache")
def the_cache_folder_named_by_the_environment() -> tuple:
    served(cache_dir=folder(), compiler="inductor")
    torch._dynamo.reset()
    with _variable("PIECEWORKS_CACHE_DIR", folder()), pieceworks.counters.expect(num_traces_reused=1):
        return _call(rows(3, 8), compiler="inductor")


# ---- more warm starts --------------------------------------------------------------------------------------
@attempt("warm start")
def weights_loaded_in_place_after_a_warm_start() -> tuple:
    return _warm(
        lambda s: s.model.load_state_dict({k: torch.randn_like(v) for k, v in s.model.state_dict().items()})
    )


@attempt("warm start", "refused")
def a_parameter_replaced_after_a_warm_start() -> tuple:
    return _warm(lambda s: setattr(s.model.layers[1].proj, "bias", nn.Parameter(torch.zeros(8))))


@attempt("warm start")
def a_warm_start_of_a_model_with_other_weights() -> tuple:
    served(cache_dir=folder(), compiler="inductor")
    torch._dynamo.reset()
    torch.manual_seed(1)
    model = Model()
    with pieceworks.counters.expect(num_traces_reused=1):
        return calls(served(model, cache_dir=folder(), compiler="inductor"))


@attempt("warm start")
def a_warm_start_whose_first_call_has_batch_1() -> tuple:
    served(cache_dir=folder(), compiler="inductor")
    torch._dynamo.reset()
    with pieceworks.counters.expect(num_traces_reused=1):
        return calls(served(first=1, cache_dir=folder(), compiler="inductor"))


@attempt("warm start")
def a_warm_start_whose_first_call_passes_a_keyword() -> tuple:
    served(cache_dir=folder(), compiler="inductor")
    torch._dynamo.reset()
    return _call(tuple, lambda: {"x": torch.randn(3, 8)}, cache_dir=folder(), compiler="inductor")


# ---- more model forms, calls and process state ------------------------------------------------------------
@attempt("model state", "right")
def a_linear_bias_set_to_none() -> tuple:
    return after_first_call(lambda s: setattr(s.model.layers[0].proj, "bias", None))


@attempt("model forms", "right")
def a_bound_forward_compiled_then_an_attribute_set() -> tuple:
    torch.manual_seed(0)
    model, x = Model(), torch.randn(3, 8)
    compiled = pieceworks.compile(model.forward, config())
    with torch.no_grad():
        compiled(x)
    model.scale = 3.0
    return (lambda: model(x)), (lambda: compiled(x))


@attempt("calls", "refused")
def the_compiled_model_deep_copied() -> tuple:
    s = served()
    return (lambda: s.model(s.x)), (lambda: copy.deepcopy(s.compiled)(s.x))


@attempt("calls", "refused")
def the_compiled_model_pickled() -> tuple:
    return _refused_at_build(lambda: pickle.dumps(served().compiled))


@attempt("torch.compile", "right")
def torch_compile_of_a_compiled_model() -> tuple:
    s = served()
    fn = torch.compile(s.compiled, backend="eager")
    return (lambda: s.model(s.x)), (lambda: fn(s.x))


@attempt("process", "refused")
def the_default_device_set_to_meta_after_an_inductor_compile() -> tuple:
    s = served(model=ReadsDefaultDtype(), cache_dir=folder(), compiler="inductor")
    return within(lambda: torch.device("meta"), *calls(s))


@attempt("model state")
def a_weight_norm_removed_after_the_first_call() -> tuple:
    remove = nn.utils.parametrize.remove_parametrizations
    return forms(_weight_normed, rows(5, 8), rows(3, 8), lambda m: remove(m.layers[0].proj, "weight"))


@attempt("config", "refused")
def a_vllm_field_pieceworks_lacks() -> tuple:
    return _refused_at_build(lambda: config(level=3))


@attempt("warm start")
def a_buffer_data_reassigned_to_one_element_after_a_warm_start() -> tuple:
    return _warm(lambda s: setattr(s.model.shift, "data", torch.ones(1)))


def judge(attempted: Try) -> str:
    """`right`, `refused`, `silent` or `crash` (see the module doc), with the reason after a colon."""
    with contextlib.nullcontext() if "grad on" in attempted.area else torch.no_grad():
        try:
            eager, compiled = attempted.run()
        except Exception as exc:  # noqa: BLE001 - judged below
            return _error(exc, None)
        try:
            expected: Any = eager()
        except Exception as exc:  # noqa: BLE001 - the compiled call must raise the same
            expected = exc
        try:
            got = compiled()
        except Exception as exc:  # noqa: BLE001 - judged below
            return _error(exc, expected if isinstance(expected, Exception) else None)
    if isinstance(expected, Exception):
        return f"silent: eager raised {type(expected).__name__}, the compiled call did not"
    try:
        assert_same(got, expected)  # structure, dtypes, shapes, values within the dtype's tolerance
    except AssertionError as exc:
        return f"silent: {str(exc).splitlines()[0]}"
    return "right"


def _error(exc: BaseException, eager: BaseException | None) -> str:
    if eager is not None and type(exc) is type(eager):
        return "right"
    ours = type(exc).__module__.startswith("pieceworks") or "pieceworks" in str(exc)
    return f"{'refused' if ours else 'crash'}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"


def main() -> int:
    """Run every try; print each outcome and the totals; 1 where a try's outcome is not the declared one."""
    wrong, totals = 0, dict[str, int]()
    with tempfile.TemporaryDirectory(prefix="pieceworks-sweep-") as run_folder:
        FOLDERS.append(run_folder)
        for attempted in TRIES:
            torch._dynamo.reset()
            outcome = judge(attempted)
            kind = outcome.split(":")[0]
            totals[kind] = totals.get(kind, 0) + 1
            wrong += kind != attempted.expect
            mark = "ok " if kind == attempted.expect else "BAD"
            print(f"{mark} {attempted.area:13} {attempted.name}: {outcome}", flush=True)
    print(f"{len(TRIES)} tries: " + ", ".join(f"{n} {k}" for k, n in sorted(totals.items())), flush=True)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
