"""A model file `kvdesk models` already knows it cannot use (an old or future GGUF version, a
recurrent model, a projector, a file cut short, a text file) is refused before llama.cpp is
asked, saying what was found, on every path that names it: one `Error:` line, `info`'s
`model_error`, the window's message; commands that list without a model list as for a model
not found. Small header-only files: nothing is loaded."""

from __future__ import annotations

import json
import re
from pathlib import Path

import gguf
import llama_cpp
import pytest
from test_catalog import write_gguf

from desktop_app.app import App
from desktop_app.cli import main
from desktop_app.errors import RuntimeStateError
from desktop_app.model import models
from desktop_app.model.runtime import Runtime
from desktop_app.settings import Settings


def _version_99(path):
    data = bytearray(write_gguf(path, "llama").read_bytes())
    data[4:8] = (99).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    return path


def _cut_short(path):
    whole = write_gguf(path, "llama").read_bytes()
    path.write_bytes(whole[:-4000])  # (its one tensor is 32,000 bytes)
    return path


def _adapter(path):
    """A LoRA adapter of a Gemma 3 (as llama.cpp's convert_lora_to_gguf.py writes one): its
    architecture is its model's, and only `general.type` says it is not one."""
    return write_gguf(path, "gemma3", strings=[(gguf.Keys.General.TYPE, gguf.GGUFType.ADAPTER),
                                               (gguf.Keys.Adapter.TYPE, "lora")])


BAD = {  # file -> what its error must say
    "mamba": (lambda p: write_gguf(p, "mamba"), "recurrent memory"),
    "version": (_version_99, "GGUF version 99 (kvdesk reads versions 2 and 3)"),
    "projector": (lambda p: write_gguf(p, "clip"), "is a vision projector (mmproj), not a "
                                                   "model: it gives a model vision"),
    "adapter": (_adapter, "is a LoRA adapter, not a model: it applies to the model it was "
                          "made for"),
    "cut": (_cut_short, "is cut short"),
}


@pytest.fixture
def bad(tmp_path):
    return {name: (make(tmp_path / f"{name}.gguf"), why) for name, (make, why) in BAD.items()}


@pytest.fixture
def no_llama(monkeypatch):
    """llama.cpp must not be asked to load a file whose header already says why it cannot."""
    def refuse(*args, **kwargs):
        raise AssertionError("llama.cpp was asked to load it")

    monkeypatch.setattr(llama_cpp, "Llama", refuse)


def test_an_unusable_file_is_refused_with_its_reason_before_llama_cpp_is_asked(
        bad, no_llama, capsys):
    for path, why in bad.values():
        with pytest.raises(models.UnusableModelError, match=re.escape(why)):
            App(Settings(model=str(path))).check_model()
        with pytest.raises(SystemExit) as exit_:
            main(["--model", str(path), "ask", "1", "hi"])
        assert exit_.value.code == 1
        (line,) = [x for x in capsys.readouterr().err.splitlines() if x.startswith("Error")]
        assert line.startswith(f"Error: {path}") and why in line, line
        assert "it was given by --model" in line and "Failed to load" not in line


def test_llama_cpps_refusal_gets_the_reason_too(bad):
    """(Runtime's own callers: `kvdesk eval`, the benchmarks.)"""
    for path, why in bad.values():
        with pytest.raises(RuntimeStateError, match=re.escape(why)):
            Runtime(path, model_hash="x", n_ctx=256)


def test_info_says_model_error_and_docs_lists_for_every_unusable_file(bad, tmp_path, capsys):
    from store import Store

    text = tmp_path / "text.gguf"
    text.write_text("not a model")
    with Store(tmp_path / "data") as store:
        store.add_document("h1", "Notes", "Some text.", type="txt", n_tokens=3)
    for path in [text, *(p for p, _ in bad.values())]:
        with pytest.raises(SystemExit) as exit_:
            main(["--model", str(path), "info", "--json"])
        assert exit_.value.code == 1
        info = json.loads(capsys.readouterr().out)
        assert info["model"] == str(path.resolve()) and str(path) in info["model_error"]
        main(["--model", str(path), "docs"])  # (exit status 0)
        out = capsys.readouterr()
        assert out.out.startswith("[1] Notes — 3 tokens")
        assert "Note: the model cannot be used, so which documents" in out.err


def test_a_folder_given_as_the_model_is_said_to_be_a_folder(tmp_path):
    with pytest.raises(models.ModelNotFoundError, match=f"{tmp_path} is a folder, not a model "
                       "file: give a .gguf file in it, or add the folder to the setting "
                       "model_folders"):
        models.resolve_model_path(tmp_path)


def test_the_window_says_why_the_model_set_cannot_be_used(qtbot, bad, no_llama):
    from ui.main_window import MainWindow

    path, why = bad["projector"]
    settings = Settings(model=str(path))
    window = MainWindow(lambda: App(settings).engine, settings)
    qtbot.addWidget(window)
    with qtbot.waitSignal(window.engine_failed, timeout=5000):
        pass
    said = window.info.text()
    assert said.startswith(f"The model could not be loaded: {path} ") and why in said
    assert "Failed to load" not in said


def test_the_model_list_calls_an_adapter_and_a_projector_refused_saying_what_they_are(
        bad, tmp_path):
    """(A LoRA adapter of Gemma 3 was listed "supported: tested", by its architecture.)"""
    def listed():
        found = models.discover([tmp_path], memo_dir=tmp_path / "memo", home=tmp_path / "home",
                                env={}, platform="linux")
        return {Path(m.path).stem: m for m in found}

    rows = listed()
    for name in ("adapter", "projector"):
        assert rows[name].status == "refused" and f"is {rows[name].reason}".startswith(
            bad[name][1])
    # A memo written before adapters were told apart is read again, not believed
    memo = tmp_path / "memo" / models.MEMO_FILE
    old = json.loads(memo.read_text())
    del old["format"]
    for facts in old.values():
        facts.update(status="supported", reason="tested")
    memo.write_text(json.dumps(old))
    assert listed()["adapter"].status == "refused"
