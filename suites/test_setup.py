"""`ci/setup.sh`: by default it makes the project's own virtual environment and installs there, never into the
interpreter it starts from; a base interpreter that already has torch >= 2.11 (a GPU runner's CUDA build)
lends it to the venv instead of the venv downloading one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_setup_makes_a_project_venv_that_borrows_the_base_torch(tmp_path):
    venv = tmp_path / "venv"
    # set-up's defaults only: no PIECEWORKS_* choice (wheelhouse, extras, torch index) of the runner leaks in
    env = {k: v for k, v in os.environ.items() if k != "PYTHON" and not k.startswith("PIECEWORKS_")}
    # offline: everything the `test` extra needs is in the base environment running this test
    env.update(PIECEWORKS_VENV=str(venv), PIECEWORKS_BASE_PYTHON=sys.executable, PIP_NO_INDEX="1")
    proc = subprocess.run(
        ["bash", str(ROOT / "ci" / "setup.sh")], capture_output=True, text=True, timeout=300, env=env
    )
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr[-4000:]
    python = proc.stdout.strip().splitlines()[-1]
    assert Path(python) == venv / "bin" / "python", f"setup used {python}, not the project venv"
    probe = subprocess.run(
        [
            python,
            "-c",
            "import sys, torch, importlib.util as u; "
            "print(sys.prefix); print(torch.__file__); print(u.find_spec('pieceworks').origin)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert probe.returncode == 0, probe.stderr[-4000:]
    prefix, torch_file, pieceworks_file = probe.stdout.split()
    assert Path(prefix) == venv, "the venv's python is not running in the venv"
    assert not Path(torch_file).is_relative_to(venv), f"torch was installed into the venv: {torch_file}"
    assert Path(torch_file).parent.parent == Path(__import__("torch").__file__).parent.parent
    assert Path(pieceworks_file) == ROOT / "reference" / "__init__.py"
