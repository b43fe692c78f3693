"""Run each mutant against the properties it must break; write what hypothesis reported.

`python -m pieceworks.harness.run_mutants [--gpu] --out results/property_mutants.md` runs pytest once per mutant
(see mutants.py), on the tests named below, and records for each: did the suite fail (it must), and the shrunk
falsifying example hypothesis printed. Exit status 1 if any mutant survived.
"""

from __future__ import annotations

import argparse
import datetime
import re
import subprocess
import sys

import torch

from .mutants import MUTANTS

TARGETS = {
    "split_loses_order": "suites/test_properties.py::test_split_model_equals_original",
    "getitem_to_next_piece": "suites/test_properties.py::test_split_structure",
    "index_without_checksum": "suites/test_properties.py::test_damaged_index_is_a_clear_error_never_a_wrong_entry",
    "key_ignores_config": "suites/test_properties.py::test_key_covers_graph_inputs_and_config_and_nothing_per_run",
    "pad_to_the_size_below": "suites/test_properties.py::test_padding_picks_the_smallest_captured_size_at_least_the_batch",
    "load_without_checking": "suites/test_cache_machine.py",
}
GPU_TARGETS = {
    "pad_to_the_size_below": "suites/test_properties_gpu.py::test_replay_matches_eager_for_any_batch_sequence",
    "static_copy_misses_last_row": "suites/test_properties_gpu.py::test_toy_llama_replay_matches_eager_for_any_batch_sequence",
}


def _run(mutant: str, target: str, profile: str | None) -> tuple[bool, str]:
    extra = ["--hypothesis-profile", profile] if profile else []
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", target, "-x", "-q", "-p", "no:cacheprovider", "--pieceworks-mutant", mutant,
         *extra],
        capture_output=True, text=True, timeout=900,
    )
    text = proc.stdout + proc.stderr
    failure = re.findall(r"^E\s+(\w*Error.*)$", text, re.M)
    text = re.sub(r"^E {1,7}", "", text, flags=re.M)
    found = re.search(r"(Falsifying example:.*?\n\s*\)\s*\n)", text, re.S) or re.search(
        r"(state = \w+\(\).*?state\.teardown\(\))", text, re.S)
    detail = found.group(1).strip() if found else "(none printed)"
    first_error = failure[0] if failure else ""
    return proc.returncode != 0, f"{first_error}\n{detail}".strip()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu", action="store_true", help="run the GPU mutants (needs CUDA)")
    parser.add_argument("--out", default=None)
    parser.add_argument("--profile", default=None, help="hypothesis profile, e.g. find-only (no shrinking)")
    args = parser.parse_args(argv)
    targets = GPU_TARGETS if args.gpu else TARGETS
    lines = [f"## {'GPU' if args.gpu else 'CPU'} mutants, {datetime.date.today()}, torch {torch.__version__}"
             + (f", {torch.cuda.get_device_name()}" if args.gpu else ""), ""]
    survived = []
    for mutant, target in targets.items():
        failed, detail = _run(mutant, target, args.profile)
        print(f"{mutant}: {'caught' if failed else 'SURVIVED'}", flush=True)
        if not failed:
            survived.append(mutant)
        lines += [f"### `{mutant}`: {MUTANTS[mutant][0]}", "", f"Target: `{target}`. Result: "
                  f"{'the property failed, as it must' if failed else 'the property still passed'}.", "",
                  "```", detail, "```", ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        with open(args.out, "a") as f:
            f.write(text + "\n")
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
