"""The new-user sweep: what a new user tries on a compiled model, each try judged against eager.

`python -m suites.new_user_sweep` (CPU, about a minute) runs every try of `TRIES` and prints a line each and
the totals; it exits 1 where a try gave a silent difference or a crash from inside torch, or another outcome
than it declares. `suites/test_new_user_sweep.py` runs it in the test suite. A try does something to a
compiled model, its arguments, the process, the config or the cache (after the first call, where it says so),
then calls the eager and the compiled model alike; its outcome is

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
import os
import pickle
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
def _warm(change: Callable[[Setup], Any], model: Callable[[], nn.Module] = Model, batch: int = 3) -> tuple:
    """The eager and compiled calls of a batch of `batch` after `change`, the model served from its record."""
    served(model(), cache_dir=folder(), compiler="inductor")
    torch._dynamo.reset()
    with pieceworks.counters.expect(num_traces_reused=1):  # a warm start, or the try crashes
        s = served(model(), cache_dir=folder(), compiler="inductor")
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
