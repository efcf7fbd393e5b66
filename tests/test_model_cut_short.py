"""A model file cut short (an interrupted download or copy): its header says how long it must
be, so the error says so and what to do; `info` still says which model is set."""

from __future__ import annotations

import json

import pytest

from desktop_app.cli import main
from desktop_app.errors import RuntimeStateError
from desktop_app.model import gguf_header, models
from desktop_app.model.runtime import Runtime


@pytest.fixture
def cut(model_path, tmp_path):
    path = tmp_path / "cut.gguf"
    with open(model_path, "rb") as f:
        path.write_bytes(f.read(5_000_000))
    return path


def test_the_header_says_how_long_the_file_must_be(model_path, cut):
    assert gguf_header.read(model_path).file_size == model_path.stat().st_size
    assert gguf_header.cut_short(model_path) is None
    said = gguf_header.cut_short(cut)
    assert said == (f"{cut} is cut short: 5.0 MB of the {model_path.stat().st_size / 1e6:,.1f} "
                    "MB its header says it holds (an interrupted download or copy): download "
                    "it again")
    with pytest.raises(RuntimeStateError, match="is cut short: 5.0 MB of the .* download it "
                                                "again"):
        Runtime(cut, model_hash="x", n_ctx=256)


def test_info_names_the_model_that_does_not_load_and_why(cut, monkeypatch, capsys):
    monkeypatch.setenv("KVDESK_MODEL", str(cut))
    with pytest.raises(SystemExit) as exit_:
        main(["info", "--json"])
    assert exit_.value.code == 1
    info = json.loads(capsys.readouterr().out)
    assert info["model"] == str(cut) and "is cut short" in info["model_error"]


def test_the_model_list_calls_a_file_cut_short_unusable_and_why(model_path, cut, tmp_path):
    """(`kvdesk models` listed it as supported, only for it to fail at its load.)"""
    found = models.discover([cut.parent], home=tmp_path / "home", env={}, platform="linux")
    row = next(m for m in found if m.path == str(cut))
    assert row.status == models.UNREADABLE
    assert row.reason.startswith("cut short: 5.0 MB of the ") and "download it again" in row.reason
    whole = models.discover([model_path.parent], home=tmp_path / "home", env={},
                            platform="linux")
    assert next(m for m in whole if m.path == str(model_path)).status != models.UNREADABLE
