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


PACKAGES_IN_ROOMS = ("desktop_app", "codec", "store", "ui")
ROOMS = {package: sorted(p for p in (ROOT / package).iterdir()
                         if p.is_dir() and (p / "__init__.py").exists())
         for package in PACKAGES_IN_ROOMS}


def test_every_room_says_what_it_owns_and_what_it_never_imports():
    import ast

    names = {package: {p.name for p in rooms} for package, rooms in ROOMS.items()}
    assert names["desktop_app"] >= {"model", "calibration", "kv", "chat", "server", "cli"}
    assert names["codec"] >= {"kernels", "format", "calibrated", "backend", "jit"}
    assert names["store"] >= {"datadir", "caches", "documents", "shared"}
    assert names["ui"] >= {"chat", "library", "settings", "text"}
    for package, rooms in ROOMS.items():
        for room in rooms:
            doc = ast.get_docstring(ast.parse((room / "__init__.py").read_text())) or ""
            assert "never" in doc, f"{package}/{room.name}/__init__.py does not say what it " \
                                   "must never import"


def test_modules_and_rooms_stay_small():
    """The guide: no module much over ~450 lines, no room over ~15 modules."""
    for package in PACKAGES_IN_ROOMS:
        for path in (ROOT / package).rglob("*.py"):
            n = len(path.read_text().splitlines())
            assert n <= 450, f"{path.relative_to(ROOT)} has {n} lines"
    folders = [ROOT / package for package in PACKAGES_IN_ROOMS]
    for folder in [*folders, *(room for rooms in ROOMS.values() for room in rooms)]:
        modules = [p for p in folder.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
        assert len(modules) <= 15, f"{folder.relative_to(ROOT)} holds {len(modules)} modules"
