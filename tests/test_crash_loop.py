"""A few iterations of benchmarks/crash_loop.py: a server (with its background calibration and
a blended chat's exact pass), a calibration and an attach killed with SIGKILL at random
points, the data directory checked whole after each (the long loop, with ask and gc too, is
the benchmark; tests/test_leftovers.py kills at chosen stages)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.model
def test_killed_commands_leave_the_data_whole(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.crash_loop", "--iterations", "3",
                           "--seed", "7", "--commands", "serve,calibrate,attach",
                           "--data-dir", str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["all_consistent"] and summary["iterations"] == 3
    assert summary["by_command"] == {"attach": 1, "ask": 0, "gc": 0, "calibrate": 1,
                                     "serve": 1}
