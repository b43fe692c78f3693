"""The size of the two layers of reference/, tracked per commit like any benchmark: the core (`ReferenceCore`,
reference/*.py, budget 1,900 code lines) and the model layer (`ModelLayer`, reference/model/, budget 900).

`track_lines`: all lines of a layer's Python files, or code lines only. Code lines are lines holding a
token of code: blank lines, comments and docstrings (the first string statement of a module, class or
function) do not count; a statement over three lines counts three. Reads files only, imports nothing it
measures. Runs anywhere; the per-file counts go to the details file for the report.
"""

from __future__ import annotations

import ast
import io
import os
import tokenize
from pathlib import Path

from . import _shared

_NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}


def file_lines(source: str) -> dict[str, int]:
    """`{"lines": all lines, "code": code lines}` of one Python source."""
    docstrings = docstring_lines(source)
    code: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _NOT_CODE:
            code.update(n for n in range(token.start[0], token.end[0] + 1) if n not in docstrings)
    return {"lines": len(source.splitlines()), "code": len(code)}


def docstring_lines(source: str) -> set[int]:
    """The line numbers of the module's, classes' and functions' docstrings."""
    found: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        if isinstance(node, kinds) and ast.get_docstring(node, clean=False) is not None:
            found.update(range(node.body[0].lineno, node.body[0].end_lineno + 1))
    return found


def core_lines(folder: str | None = None) -> dict[str, dict[str, int]]:
    """`{file name: file_lines(...)}` for every `.py` file of the reference core (default: the installed
    `pieceworks` package's own folder, without its subpackages; another folder, e.g. the model layer's, is
    counted the same way), plus `"total"`."""
    if folder is None:
        import pieceworks

        folder = os.path.dirname(os.path.abspath(pieceworks.__file__))
    found = {
        path.name: file_lines(path.read_text(encoding="utf-8")) for path in sorted(Path(folder).glob("*.py"))
    }
    found["total"] = {k: sum(v[k] for v in found.values()) for k in ("lines", "code")}
    return found


def model_layer_folder() -> str:
    """The installed model layer's folder (`pieceworks.model`)."""
    import pieceworks.model

    return os.path.dirname(os.path.abspath(pieceworks.model.__file__))


class ReferenceCore:
    params = [["lines", "code"]]
    param_names = ["count"]

    def setup_cache(self):
        found, layer = core_lines(), core_lines(model_layer_folder())
        _shared.write_details("code_size", {"files": found, "model_files": layer})
        return found["total"]

    def track_lines(self, total, count):
        return total[count]

    track_lines.unit = "lines"


class ModelLayer(ReferenceCore):
    def setup_cache(self):
        return core_lines(model_layer_folder())["total"]
