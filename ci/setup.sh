#!/usr/bin/env bash
# Set up a fresh machine for pieceworks: torch (reused if present), the project, and its test dependencies.
# On a CPU box this installs the local torch==2.13.0 CPU wheel; it never asks for a bare `torch` (that pulls
# gigabytes of CUDA). On a GPU runner the torch already installed is reused. Works offline when everything
# needed is already installed (the lent GPU box).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "setup: no torch found; installing the CPU build torch==2.13.0"
  pip_install "torch==2.13.0"
fi
"$PY" -c "import torch; print('setup: torch', torch.__version__, '| CUDA available:', torch.cuda.is_available())"

# --no-deps: torch is handled above; the test tools below. --no-build-isolation: no index needed for setuptools.
if ! pip_install --no-deps --no-build-isolation -e . 2>/dev/null; then
  pip_install --no-deps -e .
fi
missing=$("$PY" - <<'PYEOF'
import importlib.util
need = {"pytest": "pytest", "hypothesis": "hypothesis", "pytest_benchmark": "pytest-benchmark"}
print(" ".join(pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None))
PYEOF
)
if [ -n "$missing" ]; then
  echo "setup: installing $missing"
  pip_install $missing
fi
