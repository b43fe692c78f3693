"""README.md's CPU example runs as written (issue 7.15): the code block after "On a CPU there are no CUDA graphs",
in a process of its own with an empty pieceworks cache, its assertions included; its last line prints the Inductor
compiles the README promises (3 cold)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def _cpu_example() -> str:
    text = README.read_text()
    start = text.index("On a CPU there are no CUDA graphs")
    block = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert block, "README: no python block after 'On a CPU there are no CUDA graphs'"
    return block.group(1)


@pytest.mark.inductor
def test_the_readme_cpu_example_runs_as_written(tmp_path):
    code = _cpu_example()
    assert "CUDAGraphMode.NONE" in code and ".cuda()" not in code, "the CPU example must not need CUDA"
    env = {**os.environ, "PIECEWORKS_CACHE_DIR": str(tmp_path / "cache"), "TMPDIR": str(tmp_path)}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, f"the README's CPU example failed:\n{proc.stderr[-4000:]}"
    promised = re.search(r"print\(pieceworks\.counters\.num_inductor_compiles\)\s*#\s*(\d+)", code)
    assert promised, "the example's last line no longer says how many compiles to expect"
    printed = proc.stdout.split()
    assert printed and printed[-1] == promised.group(1), (proc.stdout, proc.stderr[-2000:])
