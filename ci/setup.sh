#!/usr/bin/env bash
# Set up pieceworks: an environment with torch, the project (editable) and the tools of its extras.
# Prints progress on stderr and, last, the interpreter to use on stdout:  PY=$(bash ci/setup.sh)
#
# Which environment (first that applies):
#   PYTHON=/path/to/python        that interpreter's environment, as it is (nothing is created)
#   PIECEWORKS_USE_CURRENT_ENV=1  the environment of python3 on PATH, as it is
#   otherwise                     the project's virtual environment .venv (PIECEWORKS_VENV moves it), made from
#                                 python3 (PIECEWORKS_BASE_PYTHON). When that interpreter has torch >= 2.11 (a GPU
#                                 runner's CUDA build, say) the venv reuses its packages instead of installing
#                                 any: --system-site-packages, or, when python3 is itself a venv (whose packages
#                                 --system-site-packages cannot reach), a .pth file calling site.addsitedir on them.
# torch is never installed as a CUDA build unasked. An environment without torch >= 2.11 gets the CPU build
#   torch==${PIECEWORKS_TORCH:-2.13.0}+cpu from pip's configured sources plus PyTorch's CPU index
#   (PIECEWORKS_TORCH_INDEX, empty for none). PyPI has no "+cpu" build, so a machine without that index fails
#   loudly here instead of downloading the CUDA build that a bare torch==2.13.0 means on PyPI for Linux.
#   For a CUDA build, install it into the environment yourself first (README: "Set-up").
# Tools: the extras in PIECEWORKS_EXTRAS (default "test"; "test bench" for the benchmarks), from the index; or,
#   with PIECEWORKS_WHEELHOUSE=DIR, offline from the pinned, hashed set in ci/wheelhouse.txt (ci/wheelhouse.sh).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { echo "setup: $*" >&2; }
die() { echo "setup: ERROR: $*" >&2; exit 1; }

# Exit 0 if this interpreter has torch >= 2.11 (read from its metadata: importing torch takes seconds), 1 if an
# older one, 2 if none. Pre-releases such as 2.11.0a0+git (NVIDIA's containers) count as 2.11.
torch_state() {
  "$1" - <<'PYEOF'
import importlib.metadata as md, re, sys
try:
    version = md.version("torch")
except md.PackageNotFoundError:
    sys.exit(2)
major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", version).groups())
sys.exit(0 if (major, minor) >= (2, 11) else 1)
PYEOF
}

check_python() {  # pyproject's requires-python, said plainly before anything is installed
  "$1" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "$1 is Python $("$1" -c 'import platform; print(platform.python_version())'); pieceworks needs Python >= 3.11"
}

make_venv() {  # make_venv BASE VENV
  local base=$1 venv=$2 state=0
  torch_state "$base" || state=$?
  if [ "$state" -ne 0 ]; then
    log "creating $venv from $base (no torch >= 2.11 there: the venv gets its own)"
    "$base" -m venv "$venv" || die "python -m venv failed for $base; install its venv module (Debian: python3-venv) or set PYTHON=/path/to/python to use an existing environment"
    return
  fi
  if "$base" -c 'import sys; sys.exit(sys.prefix == sys.base_prefix)'; then
    log "creating $venv on top of the virtual environment of $base (its torch and packages are reused)"
    "$base" -m venv --without-pip "$venv"
    "$base" - "$venv" <<'PYEOF'
import os, site, sys, sysconfig
venv = sys.argv[1]
purelib = sysconfig.get_path("purelib", vars={"base": venv, "platbase": venv})
with open(os.path.join(purelib, "_pieceworks_base.pth"), "w") as f:
    f.write("import site; " + "; ".join(f"site.addsitedir({p!r})" for p in site.getsitepackages()) + "\n")
PYEOF
  else
    log "creating $venv with --system-site-packages (the torch and packages of $base are reused)"
    "$base" -m venv --without-pip --system-site-packages "$venv"
  fi
  if ! "$venv/bin/python" -m pip --version >/dev/null 2>&1; then
    "$venv/bin/python" -m ensurepip -q >&2 || die "no pip for $venv: install pip for $base, or set PYTHON=..."
  fi
}

if [ -n "${PYTHON:-}" ]; then
  PY=$PYTHON
  log "using the environment of PYTHON=$PY as it is"
elif [ "${PIECEWORKS_USE_CURRENT_ENV:-0}" = 1 ]; then
  PY=$(command -v python3) || die "PIECEWORKS_USE_CURRENT_ENV=1 but no python3 on PATH"
  log "using the environment of $PY as it is (PIECEWORKS_USE_CURRENT_ENV=1)"
else
  VENV=${PIECEWORKS_VENV:-$ROOT/.venv}
  if ! "$VENV/bin/python" -c 'import sys' 2>/dev/null; then
    base=${PIECEWORKS_BASE_PYTHON:-$(command -v python3)} || die "no python3 on PATH: set PIECEWORKS_BASE_PYTHON"
    check_python "$base"
    rm -rf "$VENV"
    make_venv "$base" "$VENV"
  fi
  PY=$VENV/bin/python
fi
check_python "$PY"
pip_install() { "$PY" -m pip install --disable-pip-version-check -q "$@" >&2; }

# torch
state=0
torch_state "$PY" || state=$?
if [ "$state" -ne 0 ]; then
  version=${PIECEWORKS_TORCH:-2.13.0}
  index=${PIECEWORKS_TORCH_INDEX-https://download.pytorch.org/whl/cpu}
  spec="torch==$version+cpu"
  [ "$(uname -s)" = Darwin ] && spec="torch==$version"  # macOS wheels on PyPI are CPU builds, without "+cpu"
  extra=()
  if [ -n "$index" ]; then
    if "$PY" - "$index" <<'PYEOF'
import sys, urllib.error, urllib.request
try:
    urllib.request.urlopen(sys.argv[1].rstrip("/") + "/torch/", timeout=10)
except urllib.error.HTTPError:
    pass  # it answered
except OSError:
    sys.exit(1)
PYEOF
    then extra=(--extra-index-url "$index")
    else log "PyTorch's CPU index $index is unreachable: looking for $spec in pip's configured sources only"
    fi
  fi
  log "installing the CPU build $spec (about 200 MB). Never a CUDA build: for one, install torch into $PY first"
  pip_install "$spec" "${extra[@]}" || die "could not install $spec. Install the torch you want into $PY (CPU: pip install torch --index-url https://download.pytorch.org/whl/cpu) and run this again"
fi

# the project's tools, then the project itself (--no-deps: torch is settled above and must not be re-resolved)
if [ -n "${PIECEWORKS_WHEELHOUSE:-}" ]; then
  PYTHON=$PY bash "$ROOT/ci/wheelhouse.sh" install "$PIECEWORKS_WHEELHOUSE" >&2
else
  reqs=$("$PY" - "$ROOT/pyproject.toml" ${PIECEWORKS_EXTRAS:-test} <<'PYEOF'
import re, sys, tomllib
with open(sys.argv[1], "rb") as f:
    project = tomllib.load(f)["project"]
extras = {**project["optional-dependencies"], "": project["dependencies"]}
def expand(name, seen):
    for req in extras[name]:
        inner = re.fullmatch(r"pieceworks\[(.+)\]", req)
        if inner:
            for sub in inner.group(1).split(","):
                if sub not in seen:
                    seen.add(sub)
                    yield from expand(sub.strip(), seen)
        elif not re.match(r"torch\b", req):
            yield req
for name in ["", *sys.argv[2:]]:  # "": the project's own dependencies
    if name not in extras:
        sys.exit(f"setup: PIECEWORKS_EXTRAS names {name!r}; pyproject.toml has {sorted(extras)}")
    print("\n".join(dict.fromkeys(expand(name, {name}))))
PYEOF
  )
  # shellcheck disable=SC2086 # one requirement per line, none with spaces
  [ -z "$reqs" ] || pip_install $reqs  # already-satisfied requirements cost no download
fi

# The project, editable. In the project venv, skipped while it points here and pyproject.toml is unchanged.
stamp=${VENV:+$VENV/.pieceworks-installed}
want="$ROOT $(cksum < "$ROOT/pyproject.toml")"
if [ -z "$stamp" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  if ! pip_install --no-deps --no-build-isolation -e "$ROOT" 2>/dev/null; then
    pip_install --no-deps -e "$ROOT"  # builds in isolation: needs setuptools>=64 from the index
  fi
  [ -z "$stamp" ] || echo "$want" > "$stamp"
fi
"$PY" - "$ROOT" <<'PYEOF' >&2 || die "pieceworks does not resolve to $ROOT/reference with $PY (see above)"
import importlib.metadata as md, importlib.util, os, sys
spec = importlib.util.find_spec("pieceworks")  # located, not imported: importing torch takes seconds
want = os.path.join(sys.argv[1], "reference", "__init__.py")
if spec is None or os.path.realpath(spec.origin) != os.path.realpath(want):
    sys.exit(f"setup: pieceworks resolves to {spec and spec.origin}, not {want}")
print(f"setup: ready: {sys.executable} (Python {sys.version.split()[0]}, torch {md.version('torch')})")
PYEOF
echo "$PY"
