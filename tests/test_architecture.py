"""The package boundaries of the design, enforced by import-linter's contracts."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is not installed in this environment"
    proc = subprocess.run([lint], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "BROKEN" not in proc.stdout


def test_the_command_line_loads_no_model_code_until_a_command_needs_it():
    """`kvdesk --version`, `ask` through a running server and the like start in a fraction of
    a second: the CLI's modules import neither llama.cpp nor numba (the codec) themselves."""
    import subprocess
    import sys

    code = ("import sys, desktop_app.cli; "
            "print(sorted(m for m in ('numba', 'llama_cpp', 'codec') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"
