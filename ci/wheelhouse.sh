#!/usr/bin/env bash
# The offline wheel set of the GPU runner: the project's non-torch tools, pinned with sha256 hashes in
# ci/wheelhouse.txt, for the runner's Python (CPython 3.12, manylinux x86_64 by default).
#
#   bash ci/wheelhouse.sh lock  [DIR]   resolve pyproject's extras for the runner, download the wheels into DIR
#                                       and write ci/wheelhouse.txt with their hashes (needs an index)
#   bash ci/wheelhouse.sh build [DIR]   download exactly the pinned files into DIR, hashes checked (needs an index)
#   bash ci/wheelhouse.sh install [DIR] install the pinned set from DIR into $PYTHON (default python3) with no
#                                       network: --no-index --require-hashes. ci/setup.sh does this when
#                                       PIECEWORKS_WHEELHOUSE=DIR is set.
# DIR defaults to .whl (git-ignored; the folder to carry to an offline box). Knobs, for lock and build:
#   WHEELHOUSE_PYTHON=3.12  WHEELHOUSE_PLATFORMS="manylinux_2_28_x86_64 ... manylinux2014_x86_64"
#   WHEELHOUSE_EXTRAS="test bench pcg"  (those pyproject.toml has)  WHEELHOUSE_EXCLUDE="matplotlib" (the report is
#   made off the runner, and runner images carry it)  WHEELHOUSE_NO_DEPS="piecewise-cuda-graphs breakable-cuda-graphs" (need only
#   torch, which is never part of the set: the runner's own CUDA build is used).
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
LOCK=$ROOT/ci/wheelhouse.txt
cmd=${1:-}
DIR=$(realpath -m "${2:-$ROOT/.whl}")
PY=${PYTHON:-python3}
TARGET_PY=${WHEELHOUSE_PYTHON:-3.12}
read -r -a PLATFORMS <<< "${WHEELHOUSE_PLATFORMS:-manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64}"
target=(--only-binary=:all: --implementation cp --python-version "$TARGET_PY")
for p in "${PLATFORMS[@]}"; do target+=(--platform "$p"); done

case "$cmd" in
  install)
    [ -f "$LOCK" ] || { echo "wheelhouse: $LOCK is missing: run 'bash ci/wheelhouse.sh lock' where an index is reachable" >&2; exit 1; }
    [ -d "$DIR" ] || { echo "wheelhouse: no wheel folder $DIR: run 'bash ci/wheelhouse.sh build $DIR' where an index is reachable, then carry it" >&2; exit 1; }
    echo "wheelhouse: installing the pinned set of $LOCK from $DIR into $PY (no network)"
    "$PY" -m pip install --disable-pip-version-check -q --no-index --find-links "$DIR" --require-hashes -r "$LOCK"
    ;;
  build)
    mkdir -p "$DIR"
    "$PY" -m pip download --disable-pip-version-check -q --no-deps --require-hashes -r "$LOCK" -d "$DIR" "${target[@]}"
    echo "wheelhouse: $(grep -c '^[A-Za-z]' "$LOCK") pinned wheels in $DIR ($(du -sh "$DIR" | cut -f1))"
    ;;
  lock)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    "$PY" - "$ROOT/pyproject.toml" "$tmp" <<'PYEOF'
import os, re, sys, tomllib
pyproject, tmp = sys.argv[1:]
project = tomllib.load(open(pyproject, "rb"))["project"]
extras = project["optional-dependencies"]
wanted = os.environ.get("WHEELHOUSE_EXTRAS", " ".join(e for e in ("test", "bench", "pcg") if e in extras)).split()
exclude = set(os.environ.get("WHEELHOUSE_EXCLUDE", "matplotlib").split())
no_deps = set(os.environ.get("WHEELHOUSE_NO_DEPS", "piecewise-cuda-graphs breakable-cuda-graphs").split())
name = lambda req: re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0].lower().replace("_", "-")
reqs = project["dependencies"] + [r for e in wanted for r in extras[e] if not r.startswith("pieceworks[")]
reqs = [r for r in reqs if name(r) != "torch" and name(r) not in exclude]
# builds the editable install offline (bdist_wheel is built in from 70.1); torch 2.13 needs >= 77.0.3, torch 2.11
# (the GPU image) < 82: a version outside that range makes pip refuse the whole set (piecewise-cuda-graphs pulls torch in)
reqs.append("setuptools>=77.0.3,<82")
with open(os.path.join(tmp, "deps.txt"), "w") as f:
    f.write("\n".join(r for r in reqs if name(r) not in no_deps) + "\n")
with open(os.path.join(tmp, "nodeps.txt"), "w") as f:
    f.write("\n".join(r for r in reqs if name(r) in no_deps) + "\n")
PYEOF
    mkdir -p "$tmp/wheels"
    "$PY" -m pip download --disable-pip-version-check -q -r "$tmp/deps.txt" -d "$tmp/wheels" "${target[@]}"
    if grep -q . "$tmp/nodeps.txt"; then
      "$PY" -m pip download --disable-pip-version-check -q --no-deps -r "$tmp/nodeps.txt" -d "$tmp/wheels" "${target[@]}"
    fi
    "$PY" - "$tmp/wheels" "$LOCK" "$TARGET_PY" "${PLATFORMS[0]}" <<'PYEOF'
import datetime, hashlib, os, re, sys, zipfile
wheels, lock, target_py, platform = sys.argv[1:]
lines, names = [], set()
for fname in sorted(os.listdir(wheels), key=str.lower):
    if not fname.endswith(".whl"):
        sys.exit(f"wheelhouse: {fname} is not a wheel; the runner installs wheels only")
    dist, version = fname.split("-")[:2]
    dist = re.sub(r"[-_.]+", "-", dist).lower()
    if dist in ("torch", "triton") or (dist.startswith("nvidia-") and dist != "nvidia-ml-py"):  # CUDA libraries
        sys.exit(f"wheelhouse: {fname} was pulled in: something in the set depends on torch; add it to "
                 "WHEELHOUSE_NO_DEPS (the runner's own torch is used)")
    digest = hashlib.sha256(open(os.path.join(wheels, fname), "rb").read()).hexdigest()
    names.add(dist)
    lines.append(f"{dist}=={version} \\\n    --hash=sha256:{digest}")
no_deps = set(os.environ.get("WHEELHOUSE_NO_DEPS", "piecewise-cuda-graphs breakable-cuda-graphs").split())
for fname in os.listdir(wheels):  # unconditional dependencies of --no-deps wheels must be torch or in the set
    if re.sub(r"[-_.]+", "-", fname.split("-")[0]).lower() not in no_deps:
        continue
    with zipfile.ZipFile(os.path.join(wheels, fname)) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        for line in z.read(meta).decode().splitlines():
            if line.startswith("Requires-Dist:") and ";" not in line:
                dep = re.sub(r"[-_.]+", "-", re.split(r"[\s\[<>=!~;(]", line.split(":", 1)[1].strip())[0]).lower()
                if dep != "torch" and dep not in names:
                    print(f"wheelhouse: WARNING: {fname} needs {dep}, which is not in the set", file=sys.stderr)
head = (f"# Offline wheel set of the GPU runner (CPython {target_py}, {platform} and older manylinux tags), pinned\n"
        f"# with sha256 hashes. Generated by `bash ci/wheelhouse.sh lock` on {datetime.date.today()} from\n"
        "# pyproject.toml's extras without torch; regenerate, don't edit. Install: bash ci/wheelhouse.sh install DIR\n")
open(lock, "w").write(head + "\n".join(lines) + "\n")
print(f"wheelhouse: wrote {lock} ({len(lines)} wheels)")
PYEOF
    mkdir -p "$DIR"
    cp "$tmp"/wheels/*.whl "$DIR"/
    echo "wheelhouse: wheels in $DIR ($(du -sh "$DIR" | cut -f1))"
    ;;
  *)
    sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 2
    ;;
esac
