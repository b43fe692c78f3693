"""mypy on the packages under their import names.

pyproject.toml maps import names to folders (`package-dir`: pieceworks is reference/, pieceworks.harness is
harness/, pieceworks.gate is ci/gate/, ...). mypy cannot follow that mapping: it names a module after the
folders that hold it, and the editable install resolves the names through an import hook, which mypy does not
run. So this script lays out a tree of symbolic links as the imports see the code (pieceworks/ holding
reference/'s entries, pieceworks/harness/ holding harness/'s, ...; this script as ci/typecheck.py), runs mypy
on it with pyproject.toml's [tool.mypy], and prints the findings with the repository's own paths. It checks
the shipped packages (pieceworks with pieceworks.model, pieceworks.harness, .gate, .report, .conformance) and
this script; the test suites (suites/*.py, suites/benchmarks, suites/mutants) are not type-checked.

    python ci/typecheck.py [MYPY OPTIONS...]    exit status: mypy's
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Checked with the packages: this script, at its repository path (module ci.typecheck). The test suites
# (suites/*.py, suites/benchmarks, suites/mutants) are not.
SELF = "ci/typecheck.py"
# A finding's location, `path.py:line[:column]: ...`, at the start of a line of mypy's output
_LOCATION = re.compile(r"^(?P<path>[^\s:]+\.pyi?)(?=:\d)")


def package_dirs() -> dict[str, Path]:
    """The import name of each mapped package and its folder, from pyproject.toml's [tool.setuptools]."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        mapping: dict[str, str] = tomllib.load(f)["tool"]["setuptools"]["package-dir"]
    return {name: ROOT / folder for name, folder in mapping.items()}


def link_folder(src: Path, dest: Path, mapped: set[Path], skip: set[str]) -> None:
    """Fill dest with links to src's entries, except the mapped folders (and the names in skip), which are
    laid out elsewhere; a folder that holds a mapped folder deeper down is made anew, level by level."""
    dest.mkdir(parents=True, exist_ok=True)
    for entry in sorted(src.iterdir()):
        if entry.name == "__pycache__" or entry.name in skip or entry in mapped:
            continue
        if entry.is_dir() and any(m.is_relative_to(entry) for m in mapped):
            link_folder(entry, dest / entry.name, mapped, set())
        else:
            (dest / entry.name).symlink_to(entry)


def lay_out(tree: Path) -> list[str]:
    """Lay out the import tree under tree; return what mypy is to check: its top-level packages and SELF."""
    packages = package_dirs()
    mapped = set(packages.values())
    for name, src in sorted(packages.items()):  # a package before its subpackages
        children = {sub[len(name) + 1 :].split(".")[0] for sub in packages if sub.startswith(name + ".")}
        link_folder(src, tree.joinpath(*name.split(".")), mapped, children)
    (tree / SELF).parent.mkdir(parents=True, exist_ok=True)
    (tree / SELF).symlink_to(ROOT / SELF)
    return [*sorted({name.split(".")[0] for name in packages}), SELF]


def repo_path(line: str, tree: Path) -> str:
    """The line with a finding's path in the tree replaced by the path of the file in the repository."""
    match = _LOCATION.match(line)
    if not match:
        return line
    real = os.path.realpath(tree / match["path"])
    return os.path.relpath(real, ROOT) + line[match.end() :]


def main(options: list[str]) -> int:
    with tempfile.TemporaryDirectory(prefix="pieceworks-typecheck-") as tmp:
        tree = Path(tmp)
        targets = lay_out(tree)
        command = [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "--cache-dir",
            str(ROOT / ".mypy_cache"),
            "--explicit-package-bases",
            *options,
            *targets,
        ]
        proc = subprocess.run(command, cwd=tree, capture_output=True, text=True, check=False)
        for line in proc.stdout.splitlines():
            print(repo_path(line, tree))
        sys.stderr.write(proc.stderr)
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
