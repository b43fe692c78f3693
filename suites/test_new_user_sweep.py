"""The new-user sweep (suites/new_user_sweep.py) in a process of its own: every try has the outcome it
declares, so no try gives a silent difference from eager or a crash from inside torch."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.inductor
@pytest.mark.timeout(400)
def test_every_try_of_the_new_user_sweep_is_served_right_or_refused_by_name():
    proc = subprocess.run(
        [sys.executable, "-m", "suites.new_user_sweep"], cwd=REPO, capture_output=True, text=True, timeout=380
    )
    lines = proc.stdout.splitlines()
    bad = [line for line in lines if line.startswith("BAD")]
    assert proc.returncode == 0 and not bad, "\n".join(bad) or proc.stderr[-3000:]
    totals = lines[-1]
    assert "silent" not in totals and "crash" not in totals and "refused" in totals and "right" in totals, (
        totals
    )
