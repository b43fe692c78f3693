"""Run each mutant against the tests that must catch it; write what they reported.

`python -m suites.mutants [--gpu] [--profile find-only] [--only NAME ...] [--timeout S] [--out FILE]`, from
the repository root, runs pytest once per mutant on its `cpu` (or, with --gpu, `gpu`) node ids, stopping at
the first failure, and records for each: did the tests fail (they must), the first error, and the example
hypothesis printed. A run past `--timeout` (default 600 s) or ending without a failing test (a usage error,
nothing collected) counts as SURVIVED, with the reason; one whose target tests were all skipped (a 2-GPU test
on one GPU) as NO VERDICT. Prints `NAME: caught|SURVIVED|NO VERDICT (seconds)` per mutant as it goes, then the
report, which `--out` appends to FILE; exit status 1 if any survived (a mutant with no verdict is listed, not
counted). On a GPU use `--profile find-only` (no shrinking: each shrink step compiles and captures a model).
"""

from __future__ import annotations

import argparse
import datetime
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

from . import all_mutants

REPO = Path(__file__).resolve().parents[2]


def run_one(name: str, target: str, profile: str | None, timeout: float) -> tuple[bool | None, str]:
    """(caught, what pytest reported) of mutant `name` against the node ids of `target`; caught is None where
    every target test was skipped (no verdict)."""
    extra = ["--hypothesis-profile", profile] if profile else []
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                *target.split(),
                "-x",
                "-q",
                "-rs",
                "-p",
                "no:cacheprovider",
                "--pieceworks-mutant",
                name,
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
        )
    except subprocess.TimeoutExpired:
        return False, f"(no verdict within {timeout:g} s: counted as survived)"
    text = proc.stdout + proc.stderr
    # the first error pytest shows; a bare `assert` (no message) shows as `E  assert ...`
    # without an error name
    failure = re.findall(r"^E\s+((?:\w*Error|Failed)\b.*)$", text, re.M) or re.findall(
        r"^E\s+(assert\b.*)$", text, re.M
    )
    text = re.sub(r"^E {1,7}", "", text, flags=re.M)
    # the shrunk example: "Falsifying example:" (older hypothesis) or "Failing test case:";
    # or a state machine's steps
    found = re.search(
        r"((?:Falsifying example|Failing test case):.*?\n\s*\)\s*\n(?:[ \t]*Draw \d+[^\n]*\n)*)", text, re.S
    ) or re.search(r"(state = \w+\(\).*?state\.teardown\(\))", text, re.S)
    # 2-5: interrupted, internal or usage error, nothing collected: no verdict
    if proc.returncode not in (0, 1):
        return False, f"pytest exit status {proc.returncode}, not a failing test:\n{text[-1500:]}"
    # every target test skipped: no verdict
    if proc.returncode == 0 and not re.search(r"\b\d+ passed\b", text):
        return None, "every target test was skipped here:\n" + "\n".join(
            re.findall(r"^SKIPPED.*$", text, re.M)[:5] or [text[-800:]]
        )
    detail = found.group(1).strip() if found else "(none printed)"
    return proc.returncode == 1, f"{failure[0] if failure else ''}\n{detail}".strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m suites.mutants", description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="run the GPU targets (needs CUDA)")
    parser.add_argument("--out", default=None, help="append the report to this file")
    parser.add_argument("--profile", default=None, help="hypothesis profile, e.g. find-only (no shrinking)")
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME", help="run only these mutants")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per mutant run (default 600)")
    args = parser.parse_args(argv)
    kind = "gpu" if args.gpu else "cpu"
    mutants = all_mutants()
    targets = {name: getattr(m, kind) for name, m in mutants.items() if getattr(m, kind)}
    unknown = sorted(set(args.only or ()) - set(targets))
    if unknown:
        parser.error(f"not {kind.upper()} mutants: {unknown}; known: {sorted(targets)}")
    if args.only:
        targets = {name: targets[name] for name in args.only}
    lines = [
        f"## {kind.upper()} mutants, {datetime.date.today()}, torch {torch.__version__}"
        + (f", {torch.cuda.get_device_name()}" if args.gpu else ""),
        "",
    ]
    survived, unverified = [], []
    for name, target in targets.items():
        start = time.perf_counter()
        caught, detail = run_one(name, target, args.profile, args.timeout)
        verdict = {True: "caught", False: "SURVIVED", None: "NO VERDICT"}[caught]
        print(f"{name}: {verdict} ({time.perf_counter() - start:.0f} s)", flush=True)
        if caught is None:
            unverified.append(name)
        elif not caught:
            survived.append(name)
        result = {
            True: "the property failed, as it must",
            False: "the property still passed",
            None: "no verdict: its target did not run here",
        }[caught]
        lines += [
            f"### `{name}`: {mutants[name].description}",
            "",
            f"Target: `{target}`. Result: {result}.",
            "",
            "```",
            detail,
            "```",
            "",
        ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n")
    if unverified:
        print(f"no verdict (their targets did not run here): {', '.join(unverified)}")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
