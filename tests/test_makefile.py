"""The Makefile's setup and clean, checked without building anything: `make -n` for what the
first `make venv` says, and `make clean` run on a copy holding what the builds leave."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make here")


def make(folder: Path, *args: str, home: Path) -> str:
    return subprocess.run(["make", "-f", str(ROOT / "Makefile"), *args], cwd=folder,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(home)}, check=True,
                          capture_output=True, text=True, timeout=60).stdout


def test_the_first_setup_says_what_each_long_step_is_before_it(tmp_path):
    (tmp_path / "codec").mkdir()
    (tmp_path / "pyproject.toml").write_text("")  # (what the install step depends on)
    said = [line for line in make(tmp_path, "-n", "venv", home=tmp_path).splitlines()
            if line.startswith("echo ")]
    assert any("about 1.4 GB of disk" in line for line in said)
    assert any("Building llama-cpp-python 0.3.36 once: 7-20 minutes on 2 cores" in line
               for line in said)
    assert any("Installing kvdesk's dependencies" in line for line in said)
    assert any("Installing the default model" in line for line in said)
    assert any("Compiling the codec's kernels" in line for line in said)


def test_clean_removes_what_setup_and_the_builds_made_in_the_checkout(tmp_path):
    made = [".venv/bin/python", "dist/kvdesk/kvdesk", "build/codec-cache/x.nbc",
            "kvdesk.egg-info/PKG-INFO", "codec/backend/kvdesk_aot_x86.so",
            "codec/kernels/__pycache__/rans.encode-1.py311.nbi",
            "codec/__pycache__/kvdesk-kernels-cached.json", ".pytest_cache/README.md"]
    kept = ["codec/backend/aot.py", "codec/kernels/rans.py", "README.md"]
    for name in made + kept:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    make(tmp_path, "clean", home=tmp_path)
    assert [n for n in made if (tmp_path / n).exists()] == []
    assert [n for n in kept if not (tmp_path / n).exists()] == []
