"""Mutants of splitting and compiling: piece order and structure, data-dependent sizes, what goes through
Inductor and how its artifacts load."""

from __future__ import annotations

import atexit
import dataclasses
import operator
import os
import pathlib
import shutil
import tempfile

import pytest
import torch

import pieceworks.compiler as compiler
import pieceworks.piece as piece
import pieceworks.split as split

from . import mutant

_FAULTS = "suites/test_user_faults.py::"


@mutant(
    "split_module without keep_original_order (properties 1, 2)",
    cpu="suites/test_properties.py::test_split_model_equals_original",
)
def split_loses_order(mp: pytest.MonkeyPatch) -> None:
    original = split.split_module
    mp.setattr(split, "split_module", lambda *a, **k: original(*a, **{**k, "keep_original_order": False}))


@mutant(
    "getitems of a splitting op go to the next piece (property 2)",
    cpu="suites/test_properties.py::test_split_structure",
)
def getitem_to_next_piece(mp: pytest.MonkeyPatch) -> None:
    original = split.assign_pieces

    def assign(gm, ops):
        piece_of, splitting = original(gm, ops)
        for node in piece_of:
            if node.target is operator.getitem and piece_of[node] in splitting:
                piece_of[node] += 1
        return piece_of, splitting

    mp.setattr(split, "assign_pieces", assign)


@mutant(
    "piece arguments are re-derived under the fake mode, leaving unbacked symbols pending",
    cpu=_FAULTS + "test_data_dependent_sizes_compile_and_run_with_inductor",
)
def piece_args_from_a_fake_rerun(mp: pytest.MonkeyPatch) -> None:
    original = piece.traced_args

    def rerun(graph):  # derive piece arguments by running the graph under the trace's fake mode
        args = original(graph)
        fake_mode = next(a.fake_mode for a in args if hasattr(a, "fake_mode"))
        with fake_mode:
            torch.fx.Interpreter(graph).run(*args)
        return args

    mp.setattr(piece, "traced_args", rerun)


@mutant(
    "a splitting op's data-dependent size is bound in the piece that reads it",
    cpu=_FAULTS + "test_the_size_a_splitting_op_binds_stays_in_its_piece",
)
def unbacked_size_bound_in_its_reader(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(split, "binds_unbacked_size", lambda node: False)


@mutant(
    "a scalar read from a graph input (a Python float Dynamo recompiled for) crosses piece boundaries",
    cpu="suites/test_compile.py::test_torch_compile_recompiling_for_a_changed_python_float_serves_it",
)
def input_scalar_handed_between_pieces(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(split, "input_scalar", lambda node: False)


@mutant(
    "pieces with data-dependent sizes get static compiles",
    cpu=_FAULTS + "test_data_dependent_sizes_split_compile_and_run_eager",
)
def static_compiles_of_data_dependent_pieces(mp: pytest.MonkeyPatch) -> None:
    original = compiler.PieceCompiler.compile
    mp.setattr(
        compiler.PieceCompiler,
        "compile",
        lambda self, piece: original(self, dataclasses.replace(piece, unbacked_symbols=())),
    )


@mutant(
    "pieces with data-dependent sizes are captured in CUDA graphs",
    gpu=_FAULTS + "test_pieces_with_data_dependent_sizes_run_without_graphs_logged_once",
)
def data_dependent_pieces_captured(mp: pytest.MonkeyPatch) -> None:
    original = piece.uncapturable_reason

    def reason(gm, example_args):
        found = original(gm, example_args)
        return None if found is not None and found.startswith("its sizes depend on data") else found

    mp.setattr(piece, "uncapturable_reason", reason)


@mutant(
    "pieces that return nothing and write nothing go through Inductor, which saves no artifact for them: "
    "every warm start compiles them again",
    cpu="suites/test_properties.py::test_split_model_through_inductor_equals_original_and_reloads",
)
def empty_pieces_through_inductor(mp: pytest.MonkeyPatch) -> None:
    mp.setattr(compiler, "computes_tensors", lambda piece: True)


@mutant(
    "artifacts load under the user's compile_threads, so a warm start starts a pool of compile workers for "
    "kernels the artifact carries",
    cpu="suites/test_cache.py::test_artifacts_load_in_this_process",
)
def loads_start_compile_workers(mp: pytest.MonkeyPatch) -> None:
    def load(path, gm):
        artifact = torch._inductor.CompiledArtifact.load(path=path, format="binary")
        tuple_output = isinstance(
            next(n for n in reversed(gm.graph.nodes) if n.op == "output").args[0], (tuple, list)
        )

        def call(*args):
            out = artifact(*args)
            return tuple(out) if tuple_output else (out[0] if isinstance(out, (list, tuple)) else out)

        return call

    mp.setattr(compiler, "load_artifact", load)


# what the mutant's `sitecustomize` does in every child: `import pieceworks` imports Dynamo too
_LOADS_DYNAMO = """import builtins
_import = builtins.__import__
def _importing_dynamo_too(name, *args, **kwargs):
    module = _import(name, *args, **kwargs)
    if name == "pieceworks":
        _import("torch._dynamo")
    return module
builtins.__import__ = _importing_dynamo_too
"""


@mutant(
    "importing pieceworks loads Dynamo (a second of imports in every process, those that compile nothing "
    "included), as the model layer's torch compatibility module once did",
    cpu="suites/test_layout.py::test_importing_pieceworks_loads_neither_dynamo_nor_an_optional_package",
)
def dynamo_loaded_on_import(mp: pytest.MonkeyPatch) -> None:
    folder = tempfile.mkdtemp(prefix="pieceworks-mutant-")  # a child process's sitecustomize
    atexit.register(shutil.rmtree, folder, True)  # removed with this process
    pathlib.Path(folder, "sitecustomize.py").write_text(_LOADS_DYNAMO)
    mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [folder, os.environ.get("PYTHONPATH")])))
