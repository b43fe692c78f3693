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
from typing import Any

__all__ = ["CUDAGraphMode", "CompilationConfig", "ConfigError", "default_capture_sizes", "check_inductor_keys",
           "check_something_to_capture", "CAPTURE_SIZES_SHORTHAND"]

CAPTURE_SIZES_SHORTHAND = "cudagraph_capture_sizes"  # vLLM's shorthand in compile_sizes: every capture size
_OP_NAME = re.compile(r"^[A-Za-z_]\w*::[A-Za-z_]\w*(\.[A-Za-z_]\w*)?$")


class ConfigError(ValueError):
    """A `CompilationConfig` field has a value pieceworks cannot use. The message names the field and the fix."""


class CUDAGraphMode(enum.Enum):
    """How compiled code is replayed (vLLM's values).

    NONE: compiled pieces run as they are. PIECEWISE: one CUDA graph per compiled piece and batch size, splitting
    ops run eagerly between them. FULL: one graph per batch size over the whole model. FULL_AND_PIECEWISE: FULL
    where a full graph was captured for the batch, else PIECEWISE, else NONE.
    """

    NONE = 0
    PIECEWISE = 1
    FULL = 2
    FULL_AND_PIECEWISE = 3

    @property
    def has_full(self) -> bool:
        return self in (CUDAGraphMode.FULL, CUDAGraphMode.FULL_AND_PIECEWISE)

    @property
    def has_piecewise(self) -> bool:
        return self in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.FULL_AND_PIECEWISE)


def default_capture_sizes(max_size: int = 512) -> list[int]:
    """vLLM's default capture sizes: 1, 2, 4, then every 8 below 256, then every 16 up to `max_size`, and
    `max_size` itself, so that the largest batch has a graph (`max_size=257` ends with 256, 257).

    With `max_size=512` these are the 51 sizes engines usually capture.
    """
    strided = [1, 2, 4, *range(8, 256, 8), *range(256, max_size + 1, 16)]
    return [s for s in strided if s < max_size] + [max_size]


def _require(ok: Any, field: str, value: Any, problem: str, fix: str) -> None:
    """Raise `ConfigError` naming the field, its value, the problem and the fix unless `ok`."""
    if not ok:
        raise ConfigError(f"CompilationConfig.{field}={value!r}: {problem}. Fix: {fix}.")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_inductor_keys(config: dict[str, Any]) -> None:
    """Every key must be an Inductor config option (dotted for nested ones, e.g. "triton.cudagraphs")."""
    if not config:
        return
    from ._compat import inductor_config

    known = set(inductor_config().get_config_copy())
    for key in config:
        close = [] if key in known else difflib.get_close_matches(key, known, n=3)
        _require(key in known, "inductor_compile_config", config, f"{key!r} is not an Inductor config option",
                 f"use one of {close}" if close else "see torch._inductor.config for the options")


def check_something_to_capture(mode: CUDAGraphMode, capture_sizes: list[int]) -> None:
    """A graph mode needs at least one capture size: graphs are captured for those sizes only."""
    _require(capture_sizes or mode is CUDAGraphMode.NONE, "cudagraph_capture_sizes", capture_sizes, "no size to "
             f"capture, but cudagraph_mode={mode.name} captures graphs only for these sizes", "list the batch sizes "
             "to capture, leave cudagraph_capture_sizes=None for vLLM's defaults, or set cudagraph_mode=NONE")


def _int_list(field: str, value: Any) -> list[int]:
    _require(isinstance(value, (list, tuple)) and all(map(_is_int, value)), field, value, "expected a list of int",
             f"pass e.g. {field}=[1, 2, 4, 8]")
    _require(all(v > 0 for v in value), field, value, "every entry must be a positive batch size",
             "remove zero and negative entries")
    return list(value)


@dataclasses.dataclass
class CompilationConfig:
    """Configuration of one piecewise compilation.

    Fields that change compiled code (hashed by `compute_hash`): `splitting_ops`, `compile_ranges`,
    `compile_sizes`, `max_num_batched_tokens`, `compiler`, `inductor_compile_config`. The others only steer
    capture and caching.

    `compile_ranges` are endpoints with vLLM's meaning: `[e1, e2]` gives the ranges `[1, e1]`, `[e1+1, e2]` and
    `[e2+1, max_num_batched_tokens]`; each piece is compiled once per range with a symbolic batch size, and once
    per entry of `compile_sizes` for that static size. A batch size is served by its compile size if there is
    one, else by the range that holds it; a batch above `max_num_batched_tokens` is an error.
    `compile_sizes` may contain "cudagraph_capture_sizes" (vLLM's shorthand): every capture size is compiled.

    Read-only once compiled: `pieceworks.compile` and `Backend` work from a copy of their own and `freeze()` the
    config they were given, so that setting a field afterwards raises `ConfigError` instead of changing a model
    half-way (build another with `dataclasses.replace(config, ...)`; in-place edits of its lists reach no model).
    """

    splitting_ops: list[str] = dataclasses.field(default_factory=list)
    compile_ranges: list[int] = dataclasses.field(default_factory=list)
    compile_sizes: list[int | str] = dataclasses.field(default_factory=list)
    max_num_batched_tokens: int = 8192
    cudagraph_mode: CUDAGraphMode = CUDAGraphMode.PIECEWISE
    cudagraph_capture_sizes: list[int] | None = None
    cudagraph_num_warmups: int = 1
    compiler: str = "inductor"
    inductor_compile_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    cache_dir: str | None = None
    cache_enabled: bool = True
    # What a batch that would need a graph never captured does once the capture phase has closed:
    # "eager" runs it without a graph (logged once per size), "raise" raises.
    on_missing_graph: str = "eager"
    # Capture a size the first time it is seen instead of in `capture()`. Off: capture cost is paid up front.
    lazy_capture: bool = False
    # Check every replay's input addresses, not only the cheap check of the first input (see cudagraph.py).
    debug_replay_checks: bool = False

    def __post_init__(self) -> None:
        ops = self.splitting_ops
        _require(isinstance(ops, (list, tuple)), "splitting_ops", ops, "expected a list of op names",
                 'pass ["silly::attention"]')
        for name in ops:
            _require(isinstance(name, str) and _OP_NAME.match(name), "splitting_ops", ops, f"{name!r} is not an op "
                     f"name", 'write "namespace::op" or "namespace::op.overload", e.g. "silly::attention" or '
                     '"silly::attention.default"')
        self.splitting_ops = list(ops)
        top = self.max_num_batched_tokens
        _require(_is_int(top), "max_num_batched_tokens", top, "expected an int", "pass e.g. 8192")
        _require(top > 0, "max_num_batched_tokens", top, "must be positive", "pass e.g. 8192")
        ends = self.compile_ranges = _int_list("compile_ranges", self.compile_ranges)
        _require(ends == sorted(set(ends)), "compile_ranges", ends, "endpoints must be strictly increasing",
                 f"sort them and drop repeats: {sorted(set(ends))}")
        _require(not ends or ends[-1] <= top, "compile_ranges", ends, f"endpoint {ends and ends[-1]} is above "
                 f"max_num_batched_tokens={top}", "raise max_num_batched_tokens or lower the endpoint")
        mode = self.cudagraph_mode
        if not isinstance(mode, CUDAGraphMode):
            _require(isinstance(mode, str) and mode.upper() in CUDAGraphMode.__members__, "cudagraph_mode", mode,
                     "unknown mode", f"use pieceworks.CUDAGraphMode or one of {list(CUDAGraphMode.__members__)}")
            self.cudagraph_mode = CUDAGraphMode[mode.upper()]
        if self.cudagraph_capture_sizes is None:
            self.cudagraph_capture_sizes = default_capture_sizes(min(512, top))
        sizes = _int_list("cudagraph_capture_sizes", self.cudagraph_capture_sizes)
        self.cudagraph_capture_sizes = sorted(set(sizes))
        above = [s for s in self.cudagraph_capture_sizes if s > top]
        _require(not above, "cudagraph_capture_sizes", sizes, f"{above} are above the largest compile range "
                 f"{self.ranges()[-1]}", "raise max_num_batched_tokens or drop those sizes")
        check_something_to_capture(self.cudagraph_mode, sizes)
        self.compile_sizes = self._expand_compile_sizes()
        outside = [s for s in self.compile_sizes if s > top]
        _require(not outside, "compile_sizes", self.compile_sizes, f"{outside} lie outside every compile range "
                 f"{self.ranges()}", "raise max_num_batched_tokens or drop those sizes")
        warmups = self.cudagraph_num_warmups
        _require(_is_int(warmups), "cudagraph_num_warmups", warmups, "expected an int", "pass e.g. 1")
        _require(warmups >= 0, "cudagraph_num_warmups", warmups, "must be >= 0", "pass 0 or more")
        _require(self.compiler in ("inductor", "eager"), "compiler", self.compiler, "unknown compiler",
                 'use "inductor" or "eager"')
        self._check_inductor_compile_config()
        _require(self.cache_dir is None or isinstance(self.cache_dir, (str, os.PathLike)), "cache_dir",
                 self.cache_dir, "expected a path", "pass a str or pathlib.Path, or None")
        for flag in ("cache_enabled", "lazy_capture", "debug_replay_checks"):
            _require(isinstance(getattr(self, flag), bool), flag, getattr(self, flag), "expected a bool",
                     f"pass {flag}=True or False")
        _require(self.on_missing_graph in ("eager", "raise"), "on_missing_graph", self.on_missing_graph,
                 "unknown policy", 'use "eager" or "raise"')

    def _expand_compile_sizes(self) -> list[int]:
        """`compile_sizes` as sorted ints; the entry "cudagraph_capture_sizes" stands for every capture size (vLLM)."""
        sizes = self.compile_sizes
        if isinstance(sizes, (list, tuple)):
            if CAPTURE_SIZES_SHORTHAND in sizes:
                sizes = [s for s in sizes if s != CAPTURE_SIZES_SHORTHAND] + self.cudagraph_capture_sizes
            for s in sizes:
                _require(not isinstance(s, str), "compile_sizes", self.compile_sizes, f"unknown entry {s!r}",
                         f'list ints, or "{CAPTURE_SIZES_SHORTHAND}" for every capture size')
        return sorted(set(_int_list("compile_sizes", sizes)))

    def _check_inductor_compile_config(self) -> None:
        """A dict of known Inductor config keys whose values are JSON (so that the cache key covers them)."""
        options = self.inductor_compile_config
        _require(isinstance(options, dict) and all(isinstance(k, str) for k in options), "inductor_compile_config",
                 options, "expected a dict of Inductor config keys", 'pass e.g. {"max_autotune": False}')
        check_inductor_keys(options)
        try:
            json.dumps(options, sort_keys=True)
        except TypeError:
            _require(False, "inductor_compile_config", options, "values must be JSON-serialisable so that the cache "
                     "key can cover them", "pass plain bools, numbers, strings, lists and dicts")

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_frozen"):
            raise ConfigError(f"CompilationConfig.{name}: this config was handed to pieceworks.compile or a Backend "
                              f"and is frozen, so that no compiled model changes under its user. Fix: build a new one, "
                              f"e.g. dataclasses.replace(config, {name}=...), and compile again.")
        object.__setattr__(self, name, value)

    def freeze(self) -> CompilationConfig:
        """Make this config read-only (setting a field raises `ConfigError`); returns it."""
        object.__setattr__(self, "_frozen", True)
        return self

    # ---- derived values -------------------------------------------------------------------------------------
    def ranges(self) -> list[tuple[int, int]]:
        """The compile ranges as closed intervals `(lo, hi)`, in order, covering `[1, max_num_batched_tokens]`."""
        top = self.max_num_batched_tokens
        ends = [e for e in self.compile_ranges if e < top] + [top]
        return list(zip([1] + [e + 1 for e in ends[:-1]], ends))

    def resolved_cache_dir(self) -> str:
        """`cache_dir`, else `$PIECEWORKS_CACHE_DIR`, else `$XDG_CACHE_HOME/pieceworks` (`~/.cache/pieceworks`)."""
        if self.cache_dir is not None:
            return os.fspath(self.cache_dir)
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        return os.environ.get("PIECEWORKS_CACHE_DIR") or os.path.join(base, "pieceworks")

    def cache_active(self) -> bool:
        """False when `cache_enabled` is off, `PIECEWORKS_DISABLE_CACHE=1`, or the compiler is eager."""
        disabled = os.environ.get("PIECEWORKS_DISABLE_CACHE", "0") not in ("", "0")
        return self.cache_enabled and not disabled and self.compiler == "inductor"

    def compute_hash(self) -> str:
        """SHA-256 of the fields that change compiled code; equal configs give equal hashes in any process."""
        factors = {"splitting_ops": self.splitting_ops, "ranges": self.ranges(), "compile_sizes": self.compile_sizes,
                   "compiler": self.compiler, "inductor_compile_config": self.inductor_compile_config}
        return hashlib.sha256(json.dumps(factors, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
