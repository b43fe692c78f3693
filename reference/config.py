"""What to compile and capture: `CompilationConfig` and `CUDAGraphMode`.

The names follow vLLM's `CompilationConfig` so that engine authors can read a config at a glance. A config is
validated when it is built: every error names the field, the bad value and the fix. After construction the
config is treated as read-only; `compute_hash()` digests exactly the fields that change compiled code.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import hashlib
import json
import os
import re
import types
from collections.abc import Callable, Sequence
from typing import Any, Literal, Union, get_args, get_origin

from ._compat import inductor_config, inductor_option_type

CAPTURE_SIZES_SHORTHAND = "cudagraph_capture_sizes"  # vLLM's shorthand in compile_sizes: every capture size
_OP_NAME = re.compile(r"^[A-Za-z_]\w*::[A-Za-z_]\w*(\.[A-Za-z_]\w*)?$")


class ConfigError(ValueError):
    """A `CompilationConfig` field has a value pieceworks cannot use. The message names the field and the
    fix."""


class CUDAGraphMode(enum.Enum):
    """How compiled code is replayed, per kind of batch (vLLM's modes and meanings; batch_kind.py says the
    kinds).

    NONE: compiled pieces run as they are. PIECEWISE: one CUDA graph per compiled piece and batch size,
    splitting ops run eagerly between them. FULL: one graph per batch size over the whole model, for every
    batch. FULL_DECODE_ONLY: full graphs for uniform decode batches, nothing for mixed ones.
    FULL_AND_PIECEWISE: full graphs for uniform decode batches, PIECEWISE for mixed ones. Where a full graph
    cannot be had, PIECEWISE serves instead.
    """

    NONE, PIECEWISE, FULL, FULL_AND_PIECEWISE, FULL_DECODE_ONLY = range(5)

    @property
    def decode_mode(self) -> CUDAGraphMode:
        """The mode of uniform decode batches: NONE, PIECEWISE or FULL."""
        return CUDAGraphMode.FULL if self.has_full else self

    @property
    def mixed_mode(self) -> CUDAGraphMode:
        """The mode of mixed batches: NONE, PIECEWISE or FULL."""
        mixed = {"FULL_DECODE_ONLY": "NONE", "FULL_AND_PIECEWISE": "PIECEWISE"}
        return CUDAGraphMode[mixed.get(self.name, self.name)]

    @property
    def has_full(self) -> bool:
        return self in (CUDAGraphMode.FULL, CUDAGraphMode.FULL_AND_PIECEWISE, CUDAGraphMode.FULL_DECODE_ONLY)

    @property
    def has_piecewise(self) -> bool:
        return self in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL_AND_PIECEWISE)


_MODES = list(CUDAGraphMode.__members__)


def default_capture_sizes(max_size: int = 512) -> list[int]:
    """vLLM's default capture sizes: 1, 2, 4, then every 8 below 256, then every 16 up to `max_size`, and
    `max_size` itself, so that the largest batch has a graph (`max_size=257` ends with 256, 257).

    With `max_size=512` these are the 51 sizes engines usually capture.
    """
    strided = [1, 2, 4, *range(8, 256, 8), *range(256, max_size + 1, 16)]
    return [s for s in strided if s < max_size] + [max_size]


def config_error(field: str, value: Any, problem: str, fix: str) -> ConfigError:
    """A `ConfigError` naming the `CompilationConfig` field, its value, the problem and the fix."""
    return ConfigError(f"CompilationConfig.{field}={value!r}: {problem}. Fix: {fix}.")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_inductor_keys(config: dict[str, Any]) -> None:
    """Every key must be an Inductor config option (dotted for nested ones, e.g. "triton.cudagraphs"), and
    its value of the option's type."""
    # no options: Inductor's config stays unread
    known = inductor_config().get_config_copy() if config else {}
    for key, value in config.items():
        if key not in known:
            close = difflib.get_close_matches(key, known, n=3)
            fix = f"use one of {close}" if close else "see torch._inductor.config for the options"
            problem = f"{key!r} is not an Inductor config option"
            raise config_error("inductor_compile_config", config, problem, fix)
        declared = inductor_option_type(key)
        if not fits_option_type(value, declared):
            name = declared.__name__ if isinstance(declared, type) else str(declared).replace("typing.", "")
            problem = f"{key!r} takes {name}, not {value!r} ({type(value).__name__})"
            fix = f"pass a {name}, e.g. its default {known[key]!r}"
            raise config_error("inductor_compile_config", config, problem, fix)


def fits_option_type(value: Any, declared: Any) -> bool:
    """Whether a JSON `value` fits the type an Inductor option declares: bool, int, float, str, None, lists
    (or tuples), dicts, their unions and literals. A type this cannot check (a callable's, a class) fits."""
    origin = get_origin(declared) or declared
    if origin in (Union, types.UnionType):
        return any(fits_option_type(value, a) for a in get_args(declared))
    if origin is Literal:
        return any(type(value) is type(a) and value == a for a in get_args(declared))
    checked = (type(None), bool, int, float, str, list, tuple, dict)  # any other type fits
    widened = {float: (int, float), list: (list, tuple), tuple: (list, tuple)}
    return origin not in checked or type(value) in widened.get(origin, (origin,))


_BOOLS = dict.fromkeys(("1", "true", "yes", "on"), True) | dict.fromkeys(("0", "false", "no", "off"), False)


def env_flag(name: str, default: bool) -> bool:
    """The boolean environment variable `name`: 1, true, yes, on or 0, false, no, off (any case); `default`
    when unset or empty; else `ConfigError` naming the variable, its value and the spellings."""
    value = os.environ.get(name, "").strip().lower()
    if value and value not in _BOOLS:
        fix = "set it to 1, true, yes or on (or 0, false, no, off), or unset it"
        raise ConfigError(f"${name}={os.environ[name]!r} is not a boolean. Fix: {fix}.")
    return _BOOLS.get(value, default)


def expand_path(path: str | os.PathLike) -> str:
    """`path` with a leading `~` expanded (shells leave a quoted `~` as it is)."""
    return os.path.expanduser(os.fspath(path))


def check_something_to_capture(mode: CUDAGraphMode, capture_sizes: list[int]) -> None:
    """A graph mode needs at least one capture size: graphs are captured for those sizes only."""
    if not capture_sizes and mode is not CUDAGraphMode.NONE:
        problem = f"no size to capture, but cudagraph_mode={mode.name} captures graphs only for these sizes"
        defaults = "leave cudagraph_capture_sizes=None for vLLM's defaults"
        fix = f"list the batch sizes to capture, {defaults}, or set cudagraph_mode=NONE"
        raise config_error("cudagraph_capture_sizes", capture_sizes, problem, fix)


def _int_list(field: str, value: Any, top: int, fix: str | None = None) -> list[int]:
    """`value`, a list of batch sizes in `[1, top]` (`top`: max_num_batched_tokens), sorted and without
    repeats; else `ConfigError` (`fix`: what to do instead of a non-int)."""
    if not (isinstance(value, (list, tuple)) and all(map(_is_int, value))):
        raise config_error(field, value, "expected a list of int", fix or f"pass e.g. {field}=[1, 2, 4, 8]")
    if not all(v > 0 for v in value):
        raise config_error(field, value, "every entry must be a positive batch size", "drop entries below 1")
    if above := [v for v in value if v > top]:
        beyond = f"above max_num_batched_tokens={top}, so above the largest compile range"
        problem = f"{above} lie outside every compile range: {beyond}"
        raise config_error(field, value, problem, "raise max_num_batched_tokens or drop those entries")
    return sorted(set(value))


_FLAGS = ("cache_enabled", "reuse_trace", "lazy_capture", "debug_replay_checks")  # the bool fields

# Fields checked on their own, before anything else: field -> (accepts its value, problem, fix), where
# "accepts" is the type (or tuple of types) the value must have, or a predicate
_FIELD_RULES: dict[str, tuple[type | tuple[type, ...] | Callable[[Any], bool], str, str]] = {
    "splitting_ops": ((list, tuple), "expected a list of op names", 'pass ["silly::attention"]'),
    "max_num_batched_tokens": (lambda v: _is_int(v) and v > 0, "expected a positive int", "pass e.g. 8192"),
    # a known name is converted first
    "cudagraph_mode": (CUDAGraphMode, "unknown mode", f"use pieceworks.CUDAGraphMode or one of {_MODES}"),
    "cudagraph_num_warmups": (lambda v: _is_int(v) and v >= 0, "expected an int >= 0", "pass e.g. 0 or 1"),
    "compiler": (lambda v: v in ("inductor", "eager"), "unknown compiler", 'use "inductor" or "eager"'),
    "inductor_compile_config": (
        lambda v: isinstance(v, dict) and all(isinstance(k, str) for k in v),
        "expected a dict of Inductor config keys",
        'pass e.g. {"max_autotune": False}',
    ),
    "cache_dir": ((str, os.PathLike, type(None)), "expected a path", "pass a str or pathlib.Path, or None"),
    "on_missing_graph": (lambda v: v in ("eager", "raise"), "unknown policy", 'use "eager" or "raise"'),
    **{flag: (bool, "expected a bool", f"pass {flag}=True or False") for flag in _FLAGS},
}


@dataclasses.dataclass
class CompilationConfig:
    """Configuration of one piecewise compilation.

    Fields that change compiled code (hashed by `compute_hash`): `splitting_ops`, `compile_ranges`,
    `compile_sizes`, `max_num_batched_tokens`, `compiler`, `inductor_compile_config`. The others only steer
    capture and caching.

    `compile_ranges` are endpoints with vLLM's meaning: `[e1, e2]` gives the ranges `[1, e1]`, `[e1+1, e2]`
    and `[e2+1, max_num_batched_tokens]`; each piece is compiled once per range with a symbolic batch size,
    and once per entry of `compile_sizes` for that static size. A batch size is served by its compile size if
    there is one, else by the range that holds it; a batch above `max_num_batched_tokens` is an error.
    `compile_sizes` may contain "cudagraph_capture_sizes" (vLLM's shorthand): every capture size is compiled.

    Read-only once compiled: `pieceworks.compile` and `Backend` work from a copy of their own and `freeze()`
    the config they were given, so that setting a field afterwards raises `ConfigError` instead of changing a
    model half-way (build another with `dataclasses.replace(config, ...)`; in-place edits of its lists reach
    no model).
    """

    splitting_ops: list[str] = dataclasses.field(default_factory=list)
    compile_ranges: list[int] = dataclasses.field(default_factory=list)
    compile_sizes: Sequence[int | str] = dataclasses.field(default_factory=list)
    max_num_batched_tokens: int = 8192
    cudagraph_mode: CUDAGraphMode = CUDAGraphMode.PIECEWISE
    cudagraph_capture_sizes: list[int] | None = None
    cudagraph_num_warmups: int = 1
    compiler: str = "inductor"
    inductor_compile_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    cache_dir: str | None = None
    cache_enabled: bool = True
    # A first call whose model the cache already holds (its serving record: record.py) is served from the
    # record, without Dynamo's trace; off: every process traces its model.
    reuse_trace: bool = True
    # What a batch that would need a graph never captured does once the capture phase has closed:
    # "eager" runs it without a graph (logged once per size), "raise" raises.
    on_missing_graph: str = "eager"
    # Capture a size the first time it is seen instead of in `capture()`. Off: capture cost is paid up front.
    lazy_capture: bool = False
    # Check every replay's input addresses, not only the cheap check of the first input (see cudagraph.py).
    debug_replay_checks: bool = False

    def __new__(cls, *args: Any, **fields: Any) -> CompilationConfig:  # before the dataclass's own TypeError
        names = [field.name for field in dataclasses.fields(cls)]
        if unknown := [name for name in fields if name not in names]:
            fix = f"drop it; pieceworks reads these fields: {', '.join(names)}"
            raise config_error(unknown[0], fields[unknown[0]], "pieceworks has no such field", fix)
        return super().__new__(cls)

    def __post_init__(self) -> None:
        if isinstance(self.cudagraph_mode, str) and self.cudagraph_mode.upper() in _MODES:
            self.cudagraph_mode = CUDAGraphMode[self.cudagraph_mode.upper()]
        for field, (accepts, problem, fix) in _FIELD_RULES.items():
            value = getattr(self, field)
            if not (isinstance(value, accepts) if isinstance(accepts, (type, tuple)) else accepts(value)):
                raise config_error(field, value, problem, fix)
        for name in self.splitting_ops:
            if not (isinstance(name, str) and _OP_NAME.match(name)):
                fix = 'write "namespace::op" or "namespace::op.overload", e.g. "silly::attention"'
                raise config_error("splitting_ops", self.splitting_ops, f"{name!r} is not an op name", fix)
        self.splitting_ops = list(self.splitting_ops)
        top, ends, sizes = self.max_num_batched_tokens, self.compile_ranges, self.cudagraph_capture_sizes
        self.compile_ranges = _int_list("compile_ranges", ends, top)
        if self.compile_ranges != list(ends):
            fix = f"sort them and drop repeats: {self.compile_ranges}"
            raise config_error("compile_ranges", ends, "endpoints must be strictly increasing", fix)
        sizes = default_capture_sizes(min(512, top)) if sizes is None else sizes
        self.cudagraph_capture_sizes = _int_list("cudagraph_capture_sizes", sizes, top)
        check_something_to_capture(self.cudagraph_mode, self.cudagraph_capture_sizes)
        # "cudagraph_capture_sizes" in it stands for every capture size (vLLM's shorthand)
        wanted = self.compile_sizes
        if isinstance(wanted, (list, tuple)) and CAPTURE_SIZES_SHORTHAND in wanted:
            wanted = [s for s in wanted if s != CAPTURE_SIZES_SHORTHAND] + self.cudagraph_capture_sizes
        fix = f'list ints, or "{CAPTURE_SIZES_SHORTHAND}" for every capture size'
        self.compile_sizes = _int_list("compile_sizes", wanted, top, fix)
        try:
            json.dumps(self.inductor_compile_config, sort_keys=True)
        except TypeError as exc:
            problem = "values must be JSON-serialisable so that the cache key can cover them"
            fix = "pass plain bools, numbers, strings, lists and dicts"
            raise config_error("inductor_compile_config", self.inductor_compile_config, problem, fix) from exc
        # known keys with JSON values, so the cache key covers them
        check_inductor_keys(self.inductor_compile_config)

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_frozen"):
            raise ConfigError(
                f"CompilationConfig.{name}: this config was handed to pieceworks.compile or a Backend and is "
                "frozen, so that no compiled model changes under its user. Fix: build a new one, e.g. "
                f"dataclasses.replace(config, {name}=...), and compile again."
            )
        object.__setattr__(self, name, value)

    def freeze(self) -> CompilationConfig:
        """Make this config read-only (setting a field raises `ConfigError`); returns it."""
        object.__setattr__(self, "_frozen", True)
        return self

    # ---- derived values -----------------------------------------------------------------------------------
    def ranges(self) -> list[tuple[int, int]]:
        """The compile ranges as closed intervals `(lo, hi)`, in order, covering
        `[1, max_num_batched_tokens]`."""
        ends = sorted({*self.compile_ranges, self.max_num_batched_tokens})  # no endpoint is above the top
        return list(zip([1] + [e + 1 for e in ends[:-1]], ends))

    def resolved_cache_dir(self) -> str:
        """`cache_dir`, else `$PIECEWORKS_CACHE_DIR`, else `$XDG_CACHE_HOME/pieceworks`
        (`~/.cache/pieceworks`); a leading `~` of any of them is the home folder."""
        if self.cache_dir is not None:
            return expand_path(self.cache_dir)
        base = expand_path(os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"))
        return expand_path(os.environ.get("PIECEWORKS_CACHE_DIR") or os.path.join(base, "pieceworks"))

    def cache_active(self) -> bool:
        """False when `cache_enabled` is off, `PIECEWORKS_DISABLE_CACHE` is on (`env_flag`), or the
        compiler is eager."""
        disabled = env_flag("PIECEWORKS_DISABLE_CACHE", False)
        return self.cache_enabled and not disabled and self.compiler == "inductor"

    def hash_factors(self) -> dict[str, Any]:
        """The fields that change compiled code, by name (what `compute_hash` digests)."""
        split = dict(splitting_ops=self.splitting_ops, ranges=self.ranges(), compile_sizes=self.compile_sizes)
        return split | dict(compiler=self.compiler, inductor_compile_config=self.inductor_compile_config)

    def compute_hash(self) -> str:
        """SHA-256 of `hash_factors`; equal configs give equal hashes in any process."""
        text = json.dumps(self.hash_factors(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()
