"""The reference core's size (`suites/benchmarks/code_size.py`), which the benchmarks track per commit: code
lines leave out blank lines, comments and docstrings, and count every line of a statement."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pieceworks
from suites.benchmarks.code_size import core_lines, file_lines

SOURCE = textwrap.dedent('''\
    """Module docstring,
    over two lines."""
    import os  # a comment after code counts as code

    # a comment line


    class Thing:
        """Class docstring."""

        def method(self):
            """Method docstring."""
            return os.path.join(
                "a",
                "b",
            )
    ''')


def test_code_lines_leave_out_blanks_comments_and_docstrings():
    assert file_lines(SOURCE) == {"lines": 16, "code": 7}  # import, class, def and the 4-line return


def test_a_string_that_is_not_the_first_statement_is_code():
    assert file_lines('x = 1\n"""not a docstring"""\n') == {"lines": 2, "code": 2}


def test_the_core_is_the_py_files_of_one_folder_without_subfolders(tmp_path):
    (tmp_path / "a.py").write_text(SOURCE)
    (tmp_path / "b.py").write_text("x = 1\n")
    (tmp_path / "notes.txt").write_text("x = 1\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.py").write_text("x = 1\n")
    found = core_lines(str(tmp_path))
    assert set(found) == {"a.py", "b.py", "total"}
    assert found["total"] == {"lines": 17, "code": 8}


def test_the_installed_core_is_reference():
    found = core_lines()
    assert "runtime.py" in found and "report.py" not in found
    assert 0 < found["total"]["code"] < found["total"]["lines"]


def test_no_line_of_the_core_is_longer_than_110_characters():
    folder = Path(pieceworks.__file__).parent
    long = [
        f"{path.name}:{n} ({len(line)})"
        for path in sorted(folder.glob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if len(line) > 110
    ]
    assert not long, f"lines over 110 characters: {', '.join(long)}"
