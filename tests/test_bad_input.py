"""Property-based: every settings file and every value given to the command line's options
gives exit 0 with a correct result, or exit 1 with exactly one `Error:` line: never a
traceback, never a value accepted against its rule.

The engine behind the CLI is the scripted fake (ui.testing.FakeEngine), so thousands of
invocations take seconds; what the real engine does with good values is tested elsewhere.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from desktop_app import settings as settings_mod
from desktop_app.app import App
from desktop_app.cli import main
from desktop_app.options import GenerationOptions, RestoreOptions
from desktop_app.validation import InvalidValue, parse
from ui.testing import FakeEngine

SETTING_KEYS = [*settings_mod.Settings.model_fields, "version", "nonsense", ""]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                max_size=3),
    max_leaves=5)
# What a user types: numbers of every size and sign, words, unicode, nothing.
TYPED = (st.integers(-(10**12), 10**12).map(str) | st.floats().map(repr)
         | st.text(min_size=0, max_size=12) | st.sampled_from(
             ["0", "-0", "1e400", "nan", "inf", "-5", "3.5", "auto", "compact", "lossless",
              "bogus", "٣", "１２"]))
PROFILE = settings(max_examples=120, deadline=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def fake_engine(monkeypatch):
    engine = FakeEngine(step_s=0, token_s=0).seed()
    monkeypatch.setattr(App, "engine", property(lambda self: engine))
    return engine


def run(capsys, argv: list[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exited:
        main(argv)
        raise SystemExit(0)
    out, err = capsys.readouterr()
    return exited.value.code or 0, out, err


def check_outcome(code: int, out: str, err: str, as_json: bool) -> None:
    assert "Traceback" not in err and "Traceback" not in out
    if code == 0:
        if as_json:
            json.loads(out)
    else:
        assert code == 1, (code, err)
        assert sum(line.startswith("Error:") for line in err.splitlines()) == 1, err


@PROFILE
@given(st.dictionaries(st.sampled_from(SETTING_KEYS), JSON_VALUES, max_size=4)
       | JSON_VALUES)
def test_any_settings_file_loads_or_says_what_is_wrong(content):
    path = settings_mod.config_dir() / "settings.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(content))
    try:
        loaded = settings_mod.load()
    except settings_mod.SettingsError as e:
        assert str(e)
        return
    assert loaded.n_ctx is None or 256 <= loaded.n_ctx <= 1 << 20
    assert loaded.storage_budget_gb > 0
    assert math.isfinite(loaded.restore_budget_ms) and loaded.restore_budget_ms > 0


@PROFILE
@given(budget=TYPED, bandwidth=TYPED, max_tokens=TYPED, level=TYPED, seed=TYPED,
       temperature=TYPED, top_p=TYPED, repeat_last_n=TYPED, json_out=st.booleans())
@example(budget="100", bandwidth="50", max_tokens="8", level="compact", seed="7",
         temperature="0.5", top_p="0.9", repeat_last_n="-1", json_out=True)
def test_any_ask_options(capsys, fake_engine, budget, bandwidth, max_tokens, level, seed,
                         temperature, top_p, repeat_last_n, json_out):
    argv = ["ask", "1", "what?", "--budget-ms", budget, "--bandwidth-MBps", bandwidth,
            "--max-tokens", max_tokens, "--level", level, "--seed", seed,
            "--temperature", temperature, "--top-p", top_p, "--repeat-last-n", repeat_last_n,
            ] + (["--json"] if json_out else [])
    code, out, err = run(capsys, argv)
    check_outcome(code, out, err, json_out)
    if code == 0:  # accepted: then every value obeyed its rule when it reached the engine
        restore = RestoreOptions(level=level, budget_ms=float(budget),
                                 bandwidth_MBps=float(bandwidth))
        generation = GenerationOptions(max_tokens=int(max_tokens), temperature=float(temperature),
                                       top_p=float(top_p), repeat_last_n=int(repeat_last_n),
                                       seed=int(seed))
        assert fake_engine.last_call("ask")[4:] == (restore.level, generation)
        assert generation.max_tokens >= 1 and restore.budget_ms > 0


@PROFILE
@given(n_ctx=TYPED, budget_gb=TYPED)
@example(n_ctx="2048", budget_gb="0")
def test_any_global_and_gc_options(capsys, fake_engine, tmp_path, n_ctx, budget_gb):
    code, out, err = run(capsys, ["--n-ctx", n_ctx, "gc", "--budget-gb", budget_gb, "--json"])
    check_outcome(code, out, err, True)
    if code == 0:
        assert 256 <= int(n_ctx) <= 1 << 20 and 0 <= float(budget_gb) <= 1e6


def test_a_data_folder_or_ports_the_settings_refuse_are_refused_on_every_path(
        capsys, caplog, monkeypatch, tmp_path):
    """The settings file, the environment, the command line: each says the same rule, with
    the value, in one `Error:` line (exit 1); the window's dialog says it too (its tests)."""
    (tmp_path / "file").write_text("x")
    unwritable = tmp_path / "locked"
    unwritable.mkdir(mode=0o555)
    real_access = settings_mod.os.access  # (root writes anywhere: as a user it could not)
    monkeypatch.setattr(settings_mod.os, "access", lambda p, mode: real_access(p, mode)
                        and Path(p) != unwritable)
    path = settings_mod.config_dir() / "settings.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    refused = [({"data_dir": str(tmp_path / "file" / "data")}, "is a file, not a folder")]
    for saved, said in refused:
        path.write_text(json.dumps(saved))
        for argv in (["info"], ["serve"]):
            code, out, err = run(capsys, argv)
            check_outcome(code, out, err, False)
            assert code == 1 and said in err and "(got " in err, err  # (the value given)
    # A settings file's relative folders (written before they had to be absolute) are read
    # from where kvdesk starts, as they were, and said; typed in the dialog they are refused
    path.write_text(json.dumps({"data_dir": "kvdesk-data", "model_folders": ["models"]}))
    data_dir = os.environ["KVDESK_DATA_DIR"]
    monkeypatch.delenv("KVDESK_DATA_DIR")  # (the file's, then)
    code, out, err = run(capsys, ["info", "--json"])
    monkeypatch.setenv("KVDESK_DATA_DIR", data_dir)
    assert code == 0 and json.loads(out)["data_dir"] == str(Path("kvdesk-data").absolute())
    assert "data_dir 'kvdesk-data' relative: read from the folder kvdesk starts in" in \
        caplog.text and "model_folders 'models' relative" in caplog.text
    with pytest.raises(InvalidValue, match="data_dir: should be an absolute path"):
        settings_mod.Settings().with_values(data_dir="kvdesk-data")
    # A data folder this user cannot write is read, never written (a read-only copy): said
    path.write_text(json.dumps({"data_dir": str(unwritable / "data")}))
    assert [n.key for n in settings_mod.saved_settings().notices()] == ["data_dir"]
    path.write_text("{}")
    data_dir = os.environ["KVDESK_DATA_DIR"]
    monkeypatch.setenv("KVDESK_DATA_DIR", "kvdesk-data")  # (the shell's folder, as --data-dir)
    assert settings_mod.load().data_dir == str(Path("kvdesk-data").absolute())
    monkeypatch.setenv("KVDESK_DATA_DIR", data_dir)
    # A model folder not there now (a drive unplugged) is kept, and said where models are
    path.write_text(json.dumps({"model_folders": [str(tmp_path / "usb")]}))
    loaded = settings_mod.load()
    assert [n.key for n in loaded.notices()] == ["model_folders"]
    code, out, err = run(capsys, ["models"])
    assert code == 0 and f"Warning: model_folders: {tmp_path / 'usb'} is not a folder" in \
        caplog.text
    # A relative folder typed on the command line is the shell's, as any command's
    code, out, err = run(capsys, ["--data-dir", "rel", "info", "--json"])
    assert code == 0 and json.loads(out)["data_dir"] == str(Path("rel").absolute().resolve())


def test_a_level_given_with_no_cache_is_refused_not_ignored(capsys):
    """(`reopen 6 --level compact --no-cache` recomputed in silence: the level never applied.)"""
    for argv in (["reopen", "6", "--level", "compact", "--no-cache"],
                 ["ask", "--chat", "6", "hi", "--level", "high", "--no-cache", "--json"]):
        code, out, err = run(capsys, argv)
        check_outcome(code, out, err, "--json" in argv)
        assert code == 1 and "--no-cache: recomputes everything from text" in err, err
        assert "(got true)" not in err  # the flag's value says nothing the message does not
    with pytest.raises(InvalidValue, match="no_cache: recomputes everything"):
        parse(RestoreOptions, {"level": "compact", "no_cache": True})  # (the API's path)


def test_an_unknown_level_is_refused_naming_its_option(capsys):
    """(`--level foo` said "Error: unknown level(s) foo" naming no option; the API names
    kvdesk.level.)"""
    for argv in (["reopen", "6", "--level", "foo"],
                 ["ask", "--chat", "6", "hi", "--level", "Foo", "--json"]):
        code, out, err = run(capsys, argv)
        check_outcome(code, out, err, "--json" in argv)
        assert code == 1 and "Error: --level: unknown level(s) foo; known: auto" in err, err
    code, out, err = run(capsys, ["attach", "notes.txt", "--levels", "high,foo"])
    assert code == 1 and "Error: --levels: unknown level(s) foo; known: lossless" in err, err


def test_a_commands_help_is_shown_whatever_the_settings_hold(capsys, monkeypatch):
    """(With a bad setting, `kvdesk remote status --help` said the setting's error: help on
    the command that would mend it was out of reach.) The command itself still refuses."""
    monkeypatch.setenv("KVDESK_REMOTE_ENDPOINT_URL", "http://127.0.0.1:99999")
    for argv, usage in ((["remote", "status", "--help"], "Usage: kvdesk remote status"),
                        (["remote", "-h"], "Usage: kvdesk remote"),
                        (["ask", "-h"], "Usage: kvdesk ask")):
        code, out, err = run(capsys, argv)
        assert code == 0 and out.startswith(usage) and not err, (argv, out, err)
    # ("-h" as an option's value is taken for help: the command then says what is wrong.)
    for argv in (["remote", "status"], ["ask", "--chat", "6", "--", "--help"],
                 ["passages", "1", "--query", "-h"]):
        code, out, err = run(capsys, argv)
        check_outcome(code, out, err, False)
        assert code == 1 and "KVDESK_REMOTE_ENDPOINT_URL: its port" in err, (argv, err)


def test_a_folder_this_user_may_not_look_into_is_said_never_a_traceback(monkeypatch, tmp_path):
    """(Python 3.11's Path.exists and is_dir raise PermissionError there: the settings' checks
    let it out as a traceback.)"""
    locked = tmp_path / "locked"

    def refusing(real):
        def check(self, *args, **kwargs):
            if str(self).startswith(str(locked)):
                raise PermissionError(13, "Permission denied", str(self))
            return real(self, *args, **kwargs)
        return check

    for name in ("exists", "is_dir"):
        monkeypatch.setattr(Path, name, refusing(getattr(Path, name)))
    given = settings_mod.Settings().with_values(data_dir=str(locked / "data"),
                                                model_folders=(str(locked / "models"),))
    assert [n.key for n in given.notices()] == ["model_folders"]
