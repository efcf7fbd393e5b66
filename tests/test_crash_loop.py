"""A few iterations of benchmarks/crash_loop.py: attach, ask and gc killed with SIGKILL at
random points, the data directory checked whole after each (the long loop is the benchmark)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.model
def test_killed_commands_leave_the_data_whole(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "benchmarks.crash_loop", "--iterations", "2",
                           "--seed", "7", "--data-dir", str(tmp_path / "data")],
                          capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["all_consistent"] and summary["iterations"] == 2
