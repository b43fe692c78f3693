"""What the conformance suite tests: subjects (implementation x model), which properties apply to each, and
builds.

- `PROPERTIES`: each property's table name -> (capabilities it needs, what it checks). A subject whose
  implementation lacks a needed capability, whose model lacks what the property reads (argument writes), or
  whose run lacks the CUDA allocator a property reads gets "not applicable: <why>" (`not_applicable`), the why
  taken from the adapter's `contracts` where it states one. A model that cannot serve the run's batches is
  unavailable.
- `Builds`: one build at a time, for the run's capture sizes, shared by every property of a subject (tests are
  ordered subject by subject). torch.compile-based adapters reset Dynamo when they build, which would
  invalidate an earlier build, so building another subject drops the current one.
- `warm_start_case`: the compile-cache property's fresh process (run by `scenario.run_case`).
"""

from __future__ import annotations

import dataclasses
import gc
from typing import Any

import torch

from pieceworks.harness.adapters import (
    IMPLEMENTATIONS,
    Built,
    Implementation,
    load_user_implementations,
    resolve,
)

from .cases import CASES, ModelCase
from .cases import case as case_named

__all__ = [
    "PROPERTIES",
    "DEFAULT_MODELS",
    "Subject",
    "select",
    "impl_unavailable",
    "unavailable",
    "not_applicable",
    "not_observable",
    "Builds",
    "warm_start_case",
]

# name -> (what it needs, what it checks). A need is a capability of `Capabilities`, or several joined by "|"
# (any one will do); a property that needs a model writing its arguments says so in `not_applicable`.
PROPERTIES: dict[str, tuple[tuple[str, ...], str]] = {
    "replay-matches-eager": (
        (),
        "the sweep and drawn batch sequences give eager's outputs, every row of the largest "
        "size poisoned with NaN/inf before each call",
    ),
    "outputs-cut-to-batch": (
        ("padding",),
        "a padded call's outputs have eager's structure and batch-sized shapes",
    ),
    "poison-stays-in-its-rows": (
        ("padding",),
        "rows poisoned in one call never reach a later call's real rows",
    ),
    "moved-inputs-never-stale": (
        ("cuda_graphs|padding",),
        "an input that moves, changes in place or is freed and "
        "reallocated between calls gives fresh results or a clear "
        "error, never stale ones",
    ),
    "repeats-give-fresh-outputs": (
        (),
        "a batch size served again at once (new inputs, the same inputs again, a "
        "neighbour padded to the same size) gives each call's own outputs",
    ),
    "argument-writes-reach-the-caller": (
        (),
        "what the model writes into its arguments in place reaches the "
        "caller's arguments, at every batch size",
    ),
    "capture-largest-first": (("shared_pool",), "sizes are captured largest first into the shared pool"),
    "one-pool-for-all-sizes": (
        ("shared_pool",),
        "the pool of every size holds <= 1.05x the largest size alone",
    ),
    "replays-grow-no-memory": (
        ("cuda_graphs",),
        "hundreds of replays of random sizes grow no reserved bytes",
    ),
    "warm-start-compiles-nothing": (("compile_cache",), "a fresh process with the cache compiles nothing"),
}
CUDA_ONLY = {
    "one-pool-for-all-sizes": "reads the CUDA caching allocator's pool bytes",
    "replays-grow-no-memory": "reads the CUDA caching allocator's reserved bytes",
}

_MEANING = {
    "cuda_graphs": "replays CUDA graphs",
    "padding": "pads a batch to a captured size",
    "shared_pool": "captures every size into one pool",
    "compile_cache": "keeps an on-disk compile cache",
}


@dataclasses.dataclass(frozen=True)
class Subject:
    spec: str  # how it was named: a registered name or a path (what a fresh process resolves again)
    impl: Implementation
    case: ModelCase

    @property
    def id(self) -> str:
        return f"{self.impl.name}@{self.case.name}"


# The default models: one of each kind (tiny, writing its argument, llama-shaped in float32 and in bfloat16,
# Hugging Face, paged-KV attention). ToyLlama's closed-form variant (`toy-llama-tractable`) repeats ToyLlama's
# pieces with an answer known in closed form: name it, or "all", to run it too.
DEFAULT_MODELS = ("silly", "silly-inplace", "toy-llama", "toy-llama-bf16", "hf-llama", "llama")


def select(impl_specs: list[str], model_names: list[str]) -> list[Subject]:
    """Subjects for the given specs and model names. No specs: every registered implementation (users' ones
    from $PIECEWORKS_IMPLEMENTATIONS included); no model names: `DEFAULT_MODELS`; "all": every model of the
    suite; the path of a Hugging Face config.json: that model (`cases.case`). Raises ValueError naming an
    unknown model."""
    load_user_implementations()
    specs = impl_specs or list(IMPLEMENTATIONS)
    names = (
        [*CASES, *(m for m in model_names if m not in CASES and m != "all")]
        if "all" in model_names
        else (model_names or list(DEFAULT_MODELS))
    )
    cases = [case_named(m) for m in dict.fromkeys(names)]
    impls = [(spec, resolve(spec)) for spec in dict.fromkeys(specs)]
    return [Subject(spec, impl, c) for c in cases for spec, impl in impls]


def impl_unavailable(impl: Implementation, device: str) -> str | None:
    """Why the implementation cannot run here, or None."""
    if device == "cpu" and impl.capabilities.needs_cuda:
        return f"{impl.name} needs CUDA; this run is --conformance-device cpu"
    return impl.unavailable_reason()


def unavailable(subject: Subject, device: str, largest_batch: int) -> str | None:
    """Why the subject cannot run here (the implementation, the model, or a batch larger than the model
    serves), or None."""
    case = subject.case
    if case.max_batch is not None and largest_batch > case.max_batch:
        return (
            f"the {case.name} model serves at most {case.max_batch} rows, this run up to {largest_batch}: "
            "lower --conformance-max-size to run it"
        )
    return impl_unavailable(subject.impl, device) or case.unavailable()


def _why_not(impl: Implementation, key: str, fallback: str) -> str:
    return f"{impl.name}: {impl.contracts.get(key) or fallback}"


def not_applicable(subject: Subject, prop: str, device: str) -> str | None:
    """Why `prop` does not apply to the subject, before building it (capabilities, device), or None."""
    impl = subject.impl
    for need in PROPERTIES[prop][0]:
        options = need.split("|")
        if not any(getattr(impl.capabilities, capability) for capability in options):
            key = next((c for c in options if c in impl.contracts), options[0])
            claims = " or ".join(f"{c} ({_MEANING[c]})" for c in options)
            return _why_not(impl, key, f"does not claim {claims}")
    if prop == "argument-writes-reach-the-caller":
        if not subject.case.writes_arguments:
            return f"the {subject.case.name} model writes none of its arguments (silly-inplace does)"
        if "argument_writes" in impl.contracts:
            return _why_not(impl, "argument_writes", "")
    if device != "cuda" and prop in CUDA_ONLY:
        return f"{CUDA_ONLY[prop]}; this run is --conformance-device cpu"
    return None


def not_observable(subject: Subject, prop: str, built: Built) -> str | None:
    """Why `prop` cannot be checked on this build (what the adapter does not expose), or None."""
    impl = subject.impl
    if prop == "capture-largest-first" and built.capture_order is None:
        return _why_not(impl, "pool", "Built.capture_order is None: the capture order is not observable")
    if prop == "one-pool-for-all-sizes" and built.pool is None:
        return _why_not(impl, "pool", "Built.pool is None: the graph pool is not observable")
    return None


def make_inputs(case: ModelCase, device: str):
    """What an adapter's `build` gets: `make_inputs(batch)` -> the model's arguments for `batch` rows, on
    `device`, the same values for the same batch."""
    return lambda batch: case.inputs(batch, batch, torch.device(device))


class Builds:
    """The current build (one subject at a time) and the subjects built at least once in this pytest run."""

    def __init__(self, device: str, capture_sizes: list[int]) -> None:
        self.device, self.capture_sizes = device, list(capture_sizes)
        self.key: str | None = None
        self.current: tuple[torch.nn.Module, Built] | None = None
        # subject id -> Built.compiles of its (first) build in this run
        self.compiles: dict[str, int | None] = {}
        self.failed: dict[str, str] = {}

    def get(self, subject: Subject) -> tuple[torch.nn.Module, Built]:
        """(eager model, build) for `subject`, built now unless it is the current one."""
        if subject.id in self.failed:
            raise RuntimeError(f"building {subject.id} failed earlier in this run: {self.failed[subject.id]}")
        if self.key != subject.id:
            self.drop()
            case = subject.case
            try:
                model = case.make(torch.device(self.device))
                with torch.no_grad():
                    built = subject.impl.build(
                        model,
                        make_inputs(case, self.device),
                        list(self.capture_sizes),
                        list(case.splitting_ops),
                    )
            except Exception as exc:
                self.failed[subject.id] = f"{type(exc).__name__}: {exc}"[:500]
                raise
            self.key, self.current = subject.id, (model, built)
            self.compiles.setdefault(subject.id, built.compiles)
        assert self.current is not None  # set with self.key
        return self.current

    def drop(self) -> None:
        """Forget the current build and free what it held."""
        self.key, self.current = None, None
        gc.collect()
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            torch.cuda.synchronize()
            torch.cuda.empty_cache()


def warm_start_case(
    specs: list[str], model: str, device: str, capture_sizes: list[int], batches: list[int]
) -> dict[str, Any]:
    """In a fresh process (the cache directory from $PIECEWORKS_CACHE_DIR): build `model` with each
    implementation in `specs` for `capture_sizes`, serve `batches`, and report, per spec, the pieces it
    compiled afresh, how many outputs matched eager, or its error."""
    from .checks import assert_same, clone

    load_user_implementations()
    case = case_named(model)
    report: dict[str, Any] = {}
    eager: torch.nn.Module | None  # None after each spec: its build freed
    built: Built | None
    for spec in specs:
        try:
            eager = case.make(torch.device(device))
            with torch.no_grad():
                built = resolve(spec).build(
                    eager, make_inputs(case, device), capture_sizes, list(case.splitting_ops)
                )
                for batch in batches:
                    args = case.inputs(batch, 7 + batch, torch.device(device))
                    expected = eager(*clone(args))
                    assert_same(built(*args), expected, f"batch {batch}")
            report[spec] = {"compiles": built.compiles, "checked": len(batches), "error": None}
        except Exception as exc:  # noqa: BLE001 - reported per spec, the others still run
            report[spec] = {"compiles": None, "checked": 0, "error": f"{type(exc).__name__}: {exc}"[:2000]}
        finally:
            built = eager = None
            gc.collect()
    return report
