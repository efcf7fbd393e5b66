"""`kvdesk selfcheck`: the installation check a bundle runs first (packaging/README.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from desktop_app import selfcheck
from desktop_app.settings import load as load_settings


@pytest.mark.model
def test_selfcheck_round_trip_leaves_user_data_alone(tmp_path):
    report = selfcheck.run(load_settings())
    assert report["ok"], report.get("traceback")
    assert report["ttft_s"] > 0 and report["restore_s"] > 0
    assert report["level"] == "compact" and report["chunks"] >= 2
    # a cold start shows: whether codec kernels compiled during the check, and for how long
    assert isinstance(report["compiled_at_start"], bool)
    assert report["compiled_at_start"] == (report["compile_s"] > 0)
    assert report["codec_cache"]
    assert not (tmp_path / "data").exists()  # the conftest's KVDESK_DATA_DIR: never touched


def test_failure_is_reported_as_json_with_status_1(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "desktop_app", "--model", str(tmp_path / "nope.gguf"),
         "selfcheck", "--json"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    report = json.loads(proc.stdout)
    assert report["ok"] is False
    assert report["error"].startswith("ModelNotFoundError: model file not found")
    assert report["error"].endswith("it was given by --model: leave that out for the default "
                                    "model")  # (not the settings file, which names none)
    assert "Traceback" not in proc.stderr
