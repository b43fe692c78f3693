"""The new-user sweep (suites/new_user_sweep.py), run in a process of its own beside the suite (conftest.py
starts it once collection selected this test): every try has the outcome it declares, so no try gives a
silent difference from eager or a crash from inside torch. Opt-in (`slow`: 1.5 minutes of compiles): each
property a try found has a test of its own in the default run."""

from __future__ import annotations

import pytest


@pytest.mark.slow
@pytest.mark.inductor
@pytest.mark.timeout(620)
def test_every_try_of_the_new_user_sweep_is_served_right_or_refused_by_name(new_user_sweep):
    lines = new_user_sweep.stdout.splitlines()
    bad = [line for line in lines if line.startswith("BAD")]
    assert new_user_sweep.returncode == 0 and not bad, "\n".join(bad) or new_user_sweep.stderr[-3000:]
    totals = lines[-1]
    assert "silent" not in totals and "crash" not in totals and "refused" in totals and "right" in totals, (
        totals
    )
