"""The kvdesk command line: JSON on stdout, clear errors, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def kvdesk(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "desktop_app", *args],
                          capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_version_and_help():
    assert kvdesk("--version").stdout.strip().endswith("0.1.0")
    out = kvdesk("--help").stdout
    for command in ("info", "gui"):
        assert command in out


@pytest.mark.model
def test_info_json(model_path):
    info = json.loads(kvdesk("info", "--json").stdout)
    assert info["model"] == str(model_path.resolve())
    assert (info["n_layer"], info["n_head_kv"], info["head_dim"]) == (30, 3, 64)
    assert info["n_ctx"] == 8192
    assert info["kv_bytes_per_token"] == 23_040
    assert len(info["fingerprint"]) == 32


def test_missing_model_is_one_clear_line(tmp_path):
    proc = kvdesk("--model", str(tmp_path / "nope.gguf"), "info", "--json", check=False)
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["error"].startswith("model file not found")
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("Error: model file not found")


def test_gui_without_display_explains_headless_use(monkeypatch):
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    proc = subprocess.run([sys.executable, "-m", "desktop_app", "gui"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert "No display found" in proc.stderr and "kvdesk info" in proc.stderr
