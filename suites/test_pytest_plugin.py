"""The pytest plugin: a stuck test ends with a verdict (pytest-timeout, or the plugin's fallback where it is missing);
gpu tests get a default timeout and, without CUDA, skip with the reason."""

from __future__ import annotations

import subprocess
import sys
import textwrap

INNER = textwrap.dedent('''
    import time
    import pytest

    @pytest.mark.timeout(1)
    def test_stuck():
        time.sleep(60)

    def test_fine():
        pass

    @pytest.mark.gpu
    def test_on_a_gpu(request):
        assert request.node.get_closest_marker("timeout").args[0] == 7
''')


def test_a_stuck_test_fails_on_its_timeout_and_the_session_goes_on(tmp_path):
    (tmp_path / "test_inner.py").write_text(INNER)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "--strict-markers",
         "--pieceworks-gpu-timeout", "7", str(tmp_path / "test_inner.py")],
        capture_output=True, text=True, timeout=240, cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out
    assert "1 failed" in out and "Timeout" in out, out
    # the gpu test: skipped with the reason without CUDA, run (with its default timeout) with it
    assert ("1 passed, 1 skipped" in out and "needs CUDA" in out) or "2 passed" in out, out
