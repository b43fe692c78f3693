"""README.md says what the product does, and its examples and commands work as written.

- The CPU example (the code block after "On a CPU (no CUDA graphs)") runs in a process of its own with an
  empty pieceworks cache, its assertions included; its last line prints the Inductor compiles the README
  promises (3 cold). The GPU example (the first python block under "## Use") runs the same way on a GPU
  runner.
- The two commands `bash ci/test.sh` and `bash ci/main.sh` stand in a bash block, and `.ci/run` is the test
  command.
- The `CompilationConfig` table lists every field with its default.
- README.md stays short (150 lines at most); its links, and those of docs/, ci/README.md and
  results/README.md, name files that exist.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"


def _python_block_after(marker: str) -> str:
    text = README.read_text()
    assert marker in text, f"README: no {marker!r}"
    block = re.search(r"```python\n(.*?)```", text[text.index(marker) :], re.S)
    assert block, f"README: no python block after {marker!r}"
    return block.group(1)


def _cpu_example() -> str:
    return _python_block_after("On a CPU (no CUDA graphs)")


def _run(code: str, tmp_path: Path, timeout: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PIECEWORKS_CACHE_DIR": str(tmp_path / "cache"), "TMPDIR": str(tmp_path)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path
    )


@pytest.mark.inductor
def test_the_readme_cpu_example_runs_as_written(tmp_path):
    code = _cpu_example()
    assert "CUDAGraphMode.NONE" in code and ".cuda()" not in code, "the CPU example must not need CUDA"
    proc = _run(code, tmp_path, timeout=300)
    assert proc.returncode == 0, f"the README's CPU example failed:\n{proc.stderr[-4000:]}"
    promised = re.search(r"print\(pieceworks\.counters\.num_inductor_compiles\)\s*#\s*(\d+)", code)
    assert promised, "the example's last line no longer says how many compiles to expect"
    printed = proc.stdout.split()
    assert printed and printed[-1] == promised.group(1), (proc.stdout, proc.stderr[-2000:])


@pytest.mark.gpu
@pytest.mark.inductor
@pytest.mark.timeout(600)
def test_the_readme_gpu_example_runs_as_written(tmp_path):
    code = _python_block_after("## Use")
    assert ".cuda()" in code and "model.capture()" in code, "the first example under '## Use' is the GPU one"
    # What its comments promise: the last call (5 rows) is served from a captured graph, cut back to 5 rows.
    check = (
        "\nassert out.shape[0] == 5, out.shape\n"
        "assert model.runtime.replay_for(8, False) is not None, "
        "'batch 5 is not served by the graph of size 8'\n"
        "print('ok')\n"
    )
    proc = _run(code + check, tmp_path, timeout=540)
    assert proc.returncode == 0, f"the README's GPU example failed:\n{proc.stderr[-4000:]}"
    assert proc.stdout.split()[-1:] == ["ok"], (proc.stdout, proc.stderr[-2000:])


def test_the_two_commands_stand_in_the_readme_and_ci_runs_the_test_command():
    text = README.read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, re.S)
    lines = [line.split("#")[0].strip() for block in blocks for line in block.splitlines()]
    for command in ("bash ci/test.sh", "bash ci/main.sh"):
        assert command in lines, f"README: `{command}` is not a command line of a bash block"
        assert (REPO / command.split()[1]).is_file(), command
    assert "`.ci/run` (what CI runs) calls `bash ci/lint.sh`" in text and "beside `bash ci/test.sh -q" in text
    run = (REPO / ".ci" / "run").read_text()
    assert re.search(r"^bash ci/test\.sh -q( |$)", run, re.M), ".ci/run no longer runs `bash ci/test.sh -q`"
    assert re.search(r"^bash ci/lint\.sh", run, re.M), ".ci/run no longer runs `bash ci/lint.sh`"


def _default(field: dataclasses.Field) -> str:
    value = field.default_factory() if field.default_factory is not dataclasses.MISSING else field.default
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def test_the_config_table_lists_every_field_with_its_default():
    from pieceworks.config import CompilationConfig

    text = README.read_text()
    rows = dict(re.findall(r"^\| `(\w+)`\*? \| `([^`]*)` \|", text, re.M))
    for field in dataclasses.fields(CompilationConfig):
        if field.name.startswith("_"):
            continue
        assert field.name in rows, f"README's CompilationConfig table lacks `{field.name}`"
        assert rows[field.name] == _default(field), (field.name, rows[field.name], _default(field))
    hashed = set(re.findall(r"^\| `(\w+)`\* \|", text, re.M))
    assert hashed == {
        "splitting_ops",
        "compile_ranges",
        "compile_sizes",
        "max_num_batched_tokens",
        "compiler",
        "inductor_compile_config",
    }, "the * marks must name the fields compute_hash covers"


def test_the_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= 150, f"README.md has {lines} lines; long forms belong in docs/"


@pytest.mark.parametrize(
    "page",
    [
        "README.md",
        "ci/README.md",
        "results/README.md",
        *sorted(p.relative_to(REPO).as_posix() for p in (REPO / "docs").glob("*.md")),
    ],
)
def test_the_pages_link_to_files_that_exist(page):
    path = REPO / page
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", path.read_text())
    missing = [t for t in targets if "://" not in t and not (path.parent / t).exists()]
    assert not missing, f"{page} links to missing files: {missing}"
