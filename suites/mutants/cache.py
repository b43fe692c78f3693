"""Mutants of the compile cache: its index, entries, locks, key and fingerprints."""

from __future__ import annotations

import contextlib
import hashlib
import os
import types

import pytest
import torch

import pieceworks.cache as cache
import pieceworks.compiled as compiled
import pieceworks.compiler as compiler
import pieceworks.core as core
import pieceworks.key as key
import pieceworks.model.record as record
import pieceworks.piece as pieces
from pieceworks.counters import counters

from . import mutant

_CACHE = "suites/test_cache.py::"
_FAULTS = "suites/test_cache_faults.py::"
_ATOMIC = "suites/test_cache_atomicity.py::"
_KEY = "suites/test_cache_key.py::test_every_code_factor_moves_the_key_and_nothing_per_run_does"
_RECORD = "suites/test_record.py::"


def _load_with(mp: pytest.MonkeyPatch, read) -> None:
    """`CompileCache.load` with `read(path, entry, loader)` in place of its checks; any error: no entry."""

    def load(self, name, loader, claim=None, skip=None):
        entry = self.read_index().get(name)
        if entry is None or entry == skip:
            return None, entry
        try:
            return read(os.path.join(self.artifact_dir, entry["file"]), entry, loader), entry
        except Exception:  # noqa: BLE001 - any error reading an entry means no entry, as load does
            return None, entry

    mp.setattr(cache.CompileCache, "load", load)


@mutant(
    "the index's SHA-256 is not checked (property 3)",
    cpu="suites/test_properties.py::test_damaged_index_is_a_clear_error_never_a_wrong_entry",
)
def index_without_checksum(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(cache, "entries_digest", lambda entries: "unchecked")


@mutant(
    "artifacts load without their SHA-256 check (properties 3, 7)",
    cpu="suites/test_cache.py::test_corrupt_artifact_is_reported_and_recompiled suites/test_cache_machine.py",
)
def load_without_checking(mp: pytest.MonkeyPatch) -> None:
    _load_with(mp, lambda path, entry, loader: loader(path))


@mutant(
    "an entry loads whatever piece it claims and whatever file it names",
    cpu=_FAULTS + "test_entries_moved_between_names_never_load_for_the_wrong_piece",
)
def load_ignores_claims(mp: pytest.MonkeyPatch) -> None:
    def checked(path, entry, loader):  # the SHA-256 check only, as before entries carried claims
        with open(path, "rb") as f:
            data = f.read()
        return (
            loader(path)
            if (hashlib.sha256(data).hexdigest(), len(data)) == (entry["sha256"], entry["bytes"])
            else None
        )

    _load_with(mp, checked)


@mutant(
    "an unusable cache directory raises instead of warning once",
    cpu=_FAULTS + "test_unusable_cache_directory_warns_once_and_runs_uncached",
)
def unusable_cache_raises(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(
        cache.CompileCache, "open", classmethod(lambda cls, root, key, factors=None: cls(root, key, factors))
    )


@mutant(
    "a read-only cache raises instead of loading what is valid",
    cpu=_FAULTS + "test_read_only_cache_loads_what_is_valid_and_compiles_the_rest_in_memory",
)
def read_only_cache_raises(mp: pytest.MonkeyPatch) -> None:
    def read_only(self, exc):
        raise exc

    mp.setattr(cache.CompileCache, "mark_read_only", read_only)


@mutant(
    "a folder where the cache expects a file (or the reverse) is left in place",
    cpu=_FAULTS + "test_wrong_type_inside_the_key_directory_is_replaced",
)
def wrong_types_not_replaced(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(cache.CompileCache, "replace_corrupt", lambda self, path, what: None)


@mutant(
    "an unreadable cache index warns at every read (once per piece)",
    cpu=_CACHE + "test_unreadable_index_is_logged_and_rebuilt",
)
def index_warns_every_read(mp: pytest.MonkeyPatch) -> None:
    def read_index(self):
        try:
            with open(self.index_path, "rb") as f:
                return cache.parse_index(f.read())
        except FileNotFoundError:
            return {}
        except (OSError, cache.CacheIndexError) as exc:
            cache.log.warning("pieceworks cache index %s is unreadable (%s)", self.index_path, exc)
            return {}

    mp.setattr(cache.CompileCache, "read_index", read_index)


@mutant(
    "prune keeps key folders of other torch builds",
    cpu=_FAULTS + "test_prune_removes_key_folders_unused_for_days_or_of_another_build",
)
def prune_by_age_only(mp: pytest.MonkeyPatch) -> None:
    original = cache.prune
    mp.setattr(
        cache, "prune", lambda root, older_than_days=None, environment=None: original(root, older_than_days)
    )


@mutant(
    "prune takes an environment of another form and matches it against no folder (removing every one)",
    cpu=_FAULTS + "test_prune_removes_key_folders_unused_for_days_or_of_another_build",
)
def prune_takes_any_environment(mp: pytest.MonkeyPatch) -> None:
    original = cache.prune

    def prune(root, older_than_days=None, environment=None):
        if environment is not None and not isinstance(environment, dict):  # matched against no folder
            environment = {"given": str(environment)}
        return original(root, older_than_days, environment)

    mp.setattr(cache, "prune", prune)


@mutant(
    "cold processes do not take turns on an entry: each compiles everything",
    cpu=_CACHE + "test_concurrent_cold_processes_share_the_work",
)
def no_entry_lock(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(cache.CompileCache, "entry_lock", lambda self, name: contextlib.nullcontext())


@mutant(
    "writers merge the index without its lock",
    cpu=_ATOMIC + "test_concurrent_writers_of_different_entries_lose_nothing",
)
def store_without_index_lock(mp: pytest.MonkeyPatch) -> None:
    original = cache.CompileCache.index_lock
    mp.setattr(
        cache.CompileCache,
        "index_lock",
        lambda self, exclusive: contextlib.nullcontext() if exclusive else original(self, exclusive),
    )


@mutant(
    "the index is rewritten in place, not via a temporary file and a rename",
    cpu=_ATOMIC + "test_a_writer_failing_anywhere_leaves_no_torn_file",
)
def index_written_in_place(mp: pytest.MonkeyPatch) -> None:
    def write(path, data):
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), "wb") as f:
            f.write(data)

    mp.setattr(cache, "atomic_write", write)


def _change_cache_factors(mp: pytest.MonkeyPatch, change) -> None:
    """`change(factors)` applied to the cache factors, where the backend computes them and where tests do."""
    original = key.cache_factors
    for module in (key, compiled):
        mp.setattr(module, "cache_factors", lambda *args: change(original(*args)))


@mutant("the cache key leaves out the config (property 4)", cpu=_KEY)
def key_ignores_config(mp: pytest.MonkeyPatch) -> None:
    _change_cache_factors(mp, lambda found: {k: v for k, v in found.items() if k != "config"})


@mutant("the key leaves out the global Inductor/functorch config", cpu=_KEY)
def key_ignores_inductor_config(mp: pytest.MonkeyPatch) -> None:
    _change_cache_factors(mp, lambda found: {k: v for k, v in found.items() if k != "inductor"})


@mutant("the key includes the working directory, a per-run value", cpu=_KEY)
def key_includes_working_directory(mp: pytest.MonkeyPatch) -> None:
    _change_cache_factors(mp, lambda found: {**found, "cwd": os.getcwd()})


@mutant("the key leaves out torch's git hash", cpu=_KEY)
def key_ignores_torch_git(mp: pytest.MonkeyPatch) -> None:
    original = key.software_factors
    mp.setattr(key, "software_factors", lambda: {k: v for k, v in original().items() if k != "git"})


@mutant("graph fingerprints leave out input strides", cpu=_KEY)
def fingerprint_ignores_strides(mp: pytest.MonkeyPatch) -> None:
    original = key.describe_value

    def describe(value):
        if isinstance(value, torch.Tensor):
            return f"T({tuple(map(str, value.shape))},{value.dtype},{value.device.type})"
        return original(value)

    mp.setattr(key, "describe_value", describe)


@mutant(
    "fingerprints see x*2 and x*3 as one piece",
    cpu="suites/test_cache_dedupe.py::test_pieces_differing_in_a_constant_never_share_code",
)
def fingerprint_ignores_constants(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(
        key, "constant_text", lambda value: "number" if isinstance(value, (int, float)) else repr(value)
    )


@mutant(
    "Inductor's cache stays outside the pieceworks cache: a new host rebuilds kernels",
    cpu=_CACHE + "test_warm_start_on_a_new_host_compiles_and_builds_nothing",
)
def inductor_cache_not_carried(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(cache.CompileCache, "inductor_dir", property(lambda self: None))


@mutant(
    "num_backend_compilations counts fresh distinct compiles, not vLLM's pieces x targets",
    cpu=_CACHE + "test_warm_start_on_a_new_host_compiles_and_builds_nothing",
)
def backend_compilations_count_fresh_compiles(mp: pytest.MonkeyPatch) -> None:
    get = compiler.PieceCompiler.get

    def counted_get(self, *args):  # the old meaning: only fresh compiles count
        before, compiled = counters.num_backend_compilations, self.compiled
        fn = get(self, *args)
        counters.num_backend_compilations = before + self.compiled - compiled
        return fn

    mp.setattr(compiler.PieceCompiler, "get", counted_get)


@mutant(
    "inductor_compile_config enters the key but never reaches Inductor",
    cpu=_CACHE + "test_inductor_compile_config_reaches_the_generated_code",
)
def inductor_options_ignored(mp: pytest.MonkeyPatch) -> None:
    original = compiler.compile_inductor
    mp.setattr(
        compiler,
        "compile_inductor",
        lambda gm, args, *, static, inductor_config: original(gm, args, static=static, inductor_config={}),
    )


@mutant(
    "compile_pieces fills the split it was given with the compiled pieces: the serving record (that split) "
    "then holds compiled code, is not stored, and every warm start traces",
    cpu=_RECORD + "test_a_warm_start_neither_splits_nor_analyses_the_graph_again",
)
def split_filled_by_compile(mp: pytest.MonkeyPatch) -> None:
    original = core.compile_pieces

    def compile_pieces(graph, config):
        found = original(graph, config)
        for piece in found.pieces if isinstance(graph, core.CompiledPieces) else ():
            if piece.runnables:  # as `compile_pieces` installs a piece, but in the split's own module
                delattr(graph.stitching_module, piece.submod_name)
                setattr(graph.stitching_module, piece.submod_name, piece)
        return found

    mp.setattr(core, "compile_pieces", compile_pieces)


@mutant(
    "a piece keeps every trace value after its analysis: the serving record pickles them all and a warm "
    "start rebuilds them all",
    cpu=_RECORD + "test_a_piece_keeps_the_trace_values_its_load_and_compile_read",
)
def trace_values_all_kept(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(pieces, "drop_unread_values", lambda gm: None)


@mutant(
    "a piece drops the trace values of its method calls' receivers too: AOTAutograd's cache then stores "
    "no artifact for it, and a piece compiled from the serving record is compiled again on every start",
    cpu=_RECORD + "test_a_piece_artifact_the_cache_lost_is_compiled_from_the_record_and_stored_again",
)
def method_receivers_dropped(mp: pytest.MonkeyPatch) -> None:
    def drop_unread_values(gm):
        read = {*gm.graph.find_nodes(op="placeholder"), *gm.graph.output_node().all_input_nodes}
        for node in set(gm.graph.nodes) - read:
            node.meta.pop("example_value", None)

    mp.setattr(pieces, "drop_unread_values", drop_unread_values)


@mutant(
    "a warm start traces although the cache holds the model's serving record",
    cpu=_RECORD + "test_a_cached_model_is_served_without_tracing_or_compiling",
)
def record_never_used(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(record, "load", lambda config, model_key, facts=None: None)


@mutant(
    "a guard source Dynamo writes as object.__getattribute__ cannot be read back: "
    "such a model gets no record",
    cpu="suites/test_record.py::test_guard_sources_as_dynamo_writes_them_are_read_back",
)
def record_reads_no_generic_attributes(mp: pytest.MonkeyPatch) -> None:
    read_back = record.read_back
    mp.setattr(
        record, "read_back", lambda source, *args: read_back(source.replace("object.", "builtins."), *args)
    )


@mutant(
    "a module Dynamo names by its id is kept under that name, which no later process has",
    cpu="suites/test_record.py::test_a_module_dynamo_names_by_its_id_is_read_back_by_its_import",
)
def record_keeps_names_by_id(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(record, "portable_source", lambda source, frame_globals: source)


@mutant(
    "a serving record is used after a traced source file changed",
    cpu=_RECORD + "test_an_edited_source_file_is_traced_again",
)
def record_ignores_edited_sources(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(record, "changed_file", lambda files: None)


@mutant(
    "the serving record's key ignores the modules' plain attributes",
    cpu=_RECORD + "test_the_key_moves_with_what_changes_code_and_the_change_is_named",
)
def record_key_ignores_attributes(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(record, "plain_attributes", lambda module, where="": {})


@mutant(
    "a model served from its record forgets which arguments it writes",
    cpu=_RECORD + "test_a_cached_model_is_served_without_tracing_or_compiling",
)
def record_forgets_written_arguments(mp: pytest.MonkeyPatch) -> None:
    load = record.load
    mp.setattr(
        record,
        "load",
        lambda config, model_key, facts=None: (
            (r := load(config, model_key, facts)) and r._replace(mutated_args=[])
        ),
    )


@mutant(
    "the serving record's key names classes without the file they were loaded from",
    cpu=_RECORD + "test_the_same_class_from_another_file_is_traced",
)
def record_key_ignores_class_files(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(record, "class_origin", lambda cls: [cls.__module__, cls.__qualname__])


@mutant(
    "a record is saved although a traced file changed after the process imported it",
    cpu=_RECORD + "test_a_file_edited_after_its_import_gives_no_record",
)
def record_ignores_code_edited_after_import(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(record, "code_digest", lambda code: "any code")


@mutant(
    "a warm start serves a record whose trace read another value outside the model (a module global, a "
    "closure, a class attribute)",
    cpu=f"{_RECORD}test_a_value_read_outside_the_model_that_changed_is_traced_again_naming_it "
    f"{_RECORD}test_a_model_class_made_by_a_function_is_served_only_for_the_same_closure",
)
def record_ignores_outside_reads(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(record, "changed_read", lambda reads, model, frame_globals: None)


@mutant(
    "the cache's index files are rewritten in place with open(path, 'wb'), "
    "not via a temporary file and a rename",
    cpu=f"{_ATOMIC}test_a_writer_stopped_in_any_write_leaves_every_file_old_or_new "
    f"{_ATOMIC}test_a_reader_without_the_lock_sees_the_old_index_or_the_new",
)
def index_rewritten_with_open(mp: pytest.MonkeyPatch) -> None:
    def write(path, data):
        with open(path, "wb") as f:
            f.write(data)

    mp.setattr(cache, "atomic_write", write)


@mutant(
    "Inductor's kernels go into a pieceworks cache whose path holds a space: its C++ build fails",
    cpu=_FAULTS + "test_a_cache_path_holding_a_space_compiles_and_warm_starts",
)
def inductor_dir_with_a_space(mp: pytest.MonkeyPatch) -> None:
    original = cache.CompileCache.inductor_dir.fget

    def inductor_dir(self):  # the rule for a root without a space, applied to any root
        found = original(types.SimpleNamespace(root="root", writable=self.writable))
        return None if found is None else os.path.join(self.root, "inductor")

    mp.setattr(cache.CompileCache, "inductor_dir", property(inductor_dir))


@mutant(
    "the serving record's key holds Dynamo's debug folder, in the working directory: "
    "the same model started from another folder traces again",
    cpu=_RECORD + "test_the_same_model_started_from_another_folder_has_the_same_key",
)
def record_key_holds_the_working_directory(mp: pytest.MonkeyPatch) -> None:
    original = record.model_facts

    def model_facts(model, signatures, config):
        facts = original(model, signatures, config)
        if facts is not None:
            facts["modes"]["dynamo"]["debug_dir_root"] = torch._dynamo.config.debug_dir_root
        return facts

    mp.setattr(record, "model_facts", model_facts)


@mutant(
    "the serving record keys a functools.partial by its function alone: "
    "another bound argument serves a stale record",
    cpu=_RECORD + "test_a_partial_is_keyed_by_its_function_and_bound_arguments",
)
def record_key_ignores_bound_arguments(mp: pytest.MonkeyPatch) -> None:
    original = record.plain_value

    def plain_value(value, where, closures=False):
        return original(getattr(value, "func", value), where, closures)

    mp.setattr(record, "plain_value", plain_value)


@mutant(
    "the serving record's key ignores a parameter or buffer resized under the same name",
    cpu=_RECORD + "test_the_key_moves_with_what_changes_code_and_the_change_is_named",
)
def record_key_ignores_state_shapes(mp: pytest.MonkeyPatch) -> None:
    original = record.state_facts
    mp.setattr(
        record,
        "state_facts",
        lambda model: {
            name: {k: v for k, v in facts.items() if k != "shape"} for name, facts in original(model).items()
        },
    )


@mutant(
    "a warm start that traces again does not say what changed in its key",
    cpu=_RECORD + "test_a_warm_start_that_traces_again_names_what_changed",
)
def record_miss_unexplained(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(record.core, "key_change", lambda root, key, factors, same: None)  # what the record reads


@mutant(
    "installed library code is keyed by its distribution's name alone: another version serves the old record",
    cpu=_RECORD + "test_installed_library_code_is_keyed_by_its_distribution_version",
)
def library_version_unkeyed(mp: pytest.MonkeyPatch) -> None:
    original = record.file_identity
    mp.setattr(
        record,
        "file_identity",
        lambda path: (
            found if (found := original(path)).startswith(("sha256:", "frozen ")) else found.split(" ")[0]
        ),
    )


@mutant(
    "traced code without a file of its own (frozen standard library, a dataclass's __init__) gives no record",
    cpu=_RECORD + "test_frozen_standard_library_and_generated_code_get_a_record",
)
def fileless_code_unkeyable(mp: pytest.MonkeyPatch) -> None:
    original = record.source_file

    def source(code):
        if not os.path.isfile(code.co_filename):
            raise record.Unkeyable(f"traced code {code.co_qualname} has no source file ({code.co_filename})")
        return original(code)

    mp.setattr(record, "source_file", source)


@mutant(
    "a guard on a dict's keys compares the whole dict: a transformers model gets no serving record",
    cpu="suites/test_hf_models.py::test_a_transformers_llama_called_with_keywords_warm_starts_without_a_trace",
)
def dict_keys_guards_compare_values(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(record, "KEYS_GUARDS", set())


@mutant(
    "Inductor's CPU ISA probe is skipped without a record of a passing probe on this CPU",
    cpu="suites/test_cache.py::test_the_cpu_isa_probe_is_skipped_only_where_a_passing_probe_of_this_cpu_is_recorded",
)
def cpu_isa_probe_always_skipped(mp: pytest.MonkeyPatch) -> None:
    @contextlib.contextmanager
    def assumed(record: str):
        with torch._inductor.config.patch({"cpp.vec_isa_ok": True}):
            yield

    mp.setattr(compiler, "known_cpu_isa", assumed)


@mutant(
    "a load whose kernels Inductor's cache lacked is not counted as a kernel rebuild",
    cpu="suites/test_cache.py::test_a_warm_start_whose_kernels_inductor_lost_counts_their_rebuilds",
)
def kernel_rebuilds_uncounted(mp: pytest.MonkeyPatch) -> None:
    original = compiler.load_artifact

    def uncounted(path, gm):
        before = counters.num_kernel_rebuilds
        try:
            return original(path, gm)
        finally:
            counters.num_kernel_rebuilds = before

    mp.setattr(compiler, "load_artifact", uncounted)


@mutant(
    "a compile-cache miss of a graph cached under another key does not say what changed",
    cpu="suites/test_cache.py::test_a_compile_cache_miss_names_what_changed_in_its_key",
)
def cache_miss_unexplained(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(compiled, "key_change", lambda root, key, factors, same: None)


@mutant(
    "the serving record's key ignores the order of modules and tensors",
    cpu=_RECORD + "test_the_key_moves_with_the_order_of_modules_and_tensors",
)
def record_key_ignores_order(mp: pytest.MonkeyPatch) -> None:
    original = record.model_facts

    def unordered(*args):
        facts = original(*args)
        return facts and {k: v for k, v in facts.items() if k != "order"}

    mp.setattr(record, "model_facts", unordered)


@mutant(
    "an environment variable read inside forward is keyed by nothing: a warm start with another value is "
    "served the record's trace",
    cpu=_RECORD + "test_an_environment_variable_read_inside_forward_gets_no_record",
)
def environment_reads_recorded(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(record, "reads_environment", lambda code: False)


@mutant(
    "the state watch reads nothing the trace read outside the model: a module global, closure cell or class "
    "attribute set after the first call is served the old trace",
    cpu=_RECORD + "test_a_value_read_outside_the_model_changed_in_the_process_is_traced_again_naming_it",
)
def outside_reads_unwatched(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(record, "watched_reads", lambda sources, model, frame_globals: [])


@mutant(
    "Inductor's failed writes into the cache (a full disk) are not seen: the first call fails in Inductor",
    cpu=_FAULTS + "test_a_cache_on_a_full_disk_warns_once_and_runs_uncached",
)
def full_disk_unseen(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(compiler, "os_error_of", lambda exc: None)
