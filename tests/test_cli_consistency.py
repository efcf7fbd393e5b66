"""Smaller promises of the command line: read-only commands write nothing, the JSON's numbers
agree with each other, and settings kvdesk does not know are named, not silently ignored."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from desktop_app import settings


def kvdesk(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "desktop_app", *args], capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_a_group_alone_prints_its_help_and_remote_status_names_the_variable(tmp_path):
    """`kvdesk remote` alone printed its help as an error ("Error: Usage: ...", status 1); an
    unconfigured `remote status` named only the settings, where `push` names the variable."""
    for group in ([], ["remote"]):
        proc = kvdesk(*group)
        assert proc.stdout.startswith(f"Usage: {' '.join(['kvdesk', *group])} [OPTIONS]")
        assert "Error" not in proc.stderr
    said = kvdesk("--data-dir", str(tmp_path / "d"), "remote", "status").stdout
    assert "remote_bucket" in said and "KVDESK_REMOTE_BUCKET" in said
    assert "encode again the caches that need it" in " ".join(kvdesk("verify", "-h").stdout.split())


def test_models_does_not_create_a_data_directory(tmp_path):
    data = tmp_path / "nowhere"
    json.loads(kvdesk("--data-dir", str(data), "models", "--json").stdout)
    assert not data.exists()


@pytest.mark.model
def test_listing_and_verifying_do_not_create_a_data_directory(tmp_path):
    data = tmp_path / "mistyped"
    for command in ("docs", "chats", "verify"):
        proc = kvdesk("--data-dir", str(data), command, "--json")
        assert json.loads(proc.stdout) in ([], {}) or "chunks" in json.loads(proc.stdout)
        assert f"no data directory at {data} yet" in proc.stderr
    assert not data.exists()


def test_verify_of_a_mistyped_folder_says_there_is_nothing_to_verify(tmp_path):
    """It said "0 entries, 0 chunks, 0.0 MB, 0 codec calibrations: all intact"; then that, and
    a note above it saying the same."""
    for data in (tmp_path / "mistyped", tmp_path):
        proc = kvdesk("--data-dir", str(data), "verify")
        assert proc.stdout == f"nothing to verify: no kvdesk store in {data}\n"
        assert "Note:" not in proc.stderr, proc.stderr
    assert not (tmp_path / "mistyped").exists()


@pytest.mark.model
def test_verify_repair_with_no_store_says_so_and_creates_nothing(tmp_path):
    """(`verify --repair` made the folder, or a store and its reserve beside the user's files,
    to say all was intact.)"""
    userdocs = tmp_path / "userdocs"
    userdocs.mkdir()
    (userdocs / "notes.txt").write_text("x")
    for data in (tmp_path / "x" / "y", userdocs):
        proc = kvdesk("--data-dir", str(data), "verify", "--repair", "--json")
        assert json.loads(proc.stdout)["chunks"] == 0 and "repair" not in proc.stdout
        assert "Note: no " in proc.stderr and str(data) in proc.stderr, proc.stderr
    assert not (tmp_path / "x").exists()
    assert sorted(p.name for p in userdocs.iterdir()) == ["notes.txt"]


@pytest.mark.model
def test_commands_about_stored_things_do_not_create_a_data_directory(tmp_path):
    """(A mistyped --data-dir made a store and its 16 MB reserve to say "no chat 1".)"""
    data = tmp_path / "mistyped"
    for command in (["gc"], ["rm", "chat", "1"], ["rm", "doc", "1"], ["passages", "1"],
                    ["reopen", "1"], ["ask", "--chat", "1", "hi"], ["ask", "1", "hi"]):
        proc = subprocess.run([sys.executable, "-m", "desktop_app", "--data-dir", str(data),
                               *command], capture_output=True, text=True, timeout=300)
        assert f"no data directory at {data} yet" in proc.stderr, (command, proc.stderr)
        assert "Traceback" not in proc.stderr and not data.exists(), command
        assert proc.returncode == (0 if command == ["gc"] else 1), (command, proc.stderr)


@pytest.mark.model
def test_a_folder_with_no_store_is_read_as_no_data_directory(tmp_path):
    """(`--data-dir ~/Documents` made a store and its 16 MB reserve beside the user's files
    for `chats` to say there were none; then it said "no data directory at" the folder that
    was there.)"""
    data = tmp_path / "userdocs"
    data.mkdir()
    (data / "notes.txt").write_text("x")
    for command in (["chats"], ["docs"], ["verify"], ["gc"], ["rm", "chat", "1"],
                    ["reopen", "1"], ["export", "1"], ["ask", "--chat", "1", "hi"]):
        proc = subprocess.run([sys.executable, "-m", "desktop_app", "--data-dir", str(data),
                               *command], capture_output=True, text=True, timeout=300)
        said = proc.stdout if command == ["verify"] else proc.stderr  # (its answer says it)
        assert (f"nothing to verify: no kvdesk store in {data}" if command == ["verify"] else
                f"Note: no kvdesk data in {data} yet") in said, (command, said)
        assert "no data directory" not in proc.stderr, (command, proc.stderr)
        assert "Traceback" not in proc.stderr, command
        assert sorted(p.name for p in data.iterdir()) == ["notes.txt"], command
    kvdesk("--data-dir", str(data), "info", "--json")  # (its memos go elsewhere too)
    assert sorted(p.name for p in data.iterdir()) == ["notes.txt"]


def test_export_s_format_json_refuses_with_the_json_document_json_does(tmp_path):
    """(`export 99 --json` printed {"error": ..., "kind": "MissingError"}; `--format json`,
    the same by its help, printed no JSON document.)"""
    said = []
    for spelling in (["--json"], ["--format", "json"], ["--format=json"]):
        proc = subprocess.run([sys.executable, "-m", "desktop_app", "export", "99", *spelling],
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 1 and "Error: no chat 99" in proc.stderr, proc.stderr
        said.append(json.loads(proc.stdout))
    assert said == [{"error": "no chat 99", "kind": "MissingError"}] * 3
    proc = subprocess.run([sys.executable, "-m", "desktop_app", "export", "99"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and proc.stdout == ""  # (markdown: the error on stderr only)


# A one-shot `ask` whose write `patched` ("module.Class.method") fails for a full disk (or
# with another of the store's errors: `error`).
FULL = """
import importlib, sys
from store import errors
from desktop_app.cli import main
error = getattr(errors, sys.argv.pop(1))
def full(*args, **kwargs):
    raise error("the disk holding the data directory D is full")
module, owner, name = sys.argv.pop(1).rsplit(".", 2)
setattr(getattr(importlib.import_module(module), owner), name, full)
main(sys.argv[1:])
"""


def ask_on_a_full_disk(tmp_path, patched: str, max_tokens: int, error: str = "DiskFullError"
                       ) -> subprocess.CompletedProcess:
    doc = tmp_path / "ferry.txt"
    doc.write_text("The ferry leaves the harbour at seven.")
    kvdesk("attach", str(doc))
    return subprocess.run([sys.executable, "-c", FULL, error, patched, "ask", "1", "When?",
                           "--max-tokens", str(max_tokens), "--no-server"],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.model
def test_an_answers_cache_a_full_disk_did_not_keep_is_said_once(tmp_path):
    """(It was said plain, the cache's log line, then again as a Note.)"""
    proc = ask_on_a_full_disk(tmp_path, "desktop_app.kv.kvcache.KVCache.store_chat", 2)
    assert proc.returncode == 0, proc.stderr
    said = "this turn's cache is not stored: the disk holding the data directory D is full"
    assert proc.stderr.count(said) == 1 and f"Note: {said}" in proc.stderr, proc.stderr


@pytest.mark.model
def test_an_error_after_the_answer_streamed_starts_a_line_of_its_own(tmp_path):
    """(A terminal showed "...seven.Error: the disk ... is full" on one line.)"""
    proc = ask_on_a_full_disk(tmp_path, "desktop_app.chat.library.Library.add_turn", 4,
                              error="StoreError")
    assert proc.returncode == 1 and "Error: the disk holding" in proc.stderr, proc.stderr
    assert proc.stdout.strip() and proc.stdout.endswith("\n"), repr(proc.stdout)


@pytest.mark.model
def test_an_answer_a_full_disk_cannot_store_is_given_and_said_not_stored(tmp_path):
    """(It ended as an error, exit 1, where a vanished data folder gave the answer with a
    note: an answer shown is an answer given, on every path.)"""
    proc = ask_on_a_full_disk(tmp_path, "store.store.Store.start_chat", 4)
    assert proc.returncode == 0 and proc.stdout.strip(), proc.stderr
    assert "Note: the answer given is not stored, nor its question (nor a chat made for " \
        "them): the disk holding the data directory D is full" in proc.stderr, proc.stderr


@pytest.mark.model
def test_info_does_not_create_a_data_directory(tmp_path, model_path):
    data = tmp_path / "nowhere"
    info = json.loads(kvdesk("--data-dir", str(data), "info", "--json").stdout)
    assert info["model"] == str(model_path.resolve()) and info["fingerprint"]
    assert not data.exists()


@pytest.mark.model
def test_restore_s_counts_no_recomputing_and_blended_agrees(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("The ferry leaves the harbour at seven. " * 30)
    b.write_text("The museum opens at nine and closes at five. " * 30)
    ids = [d["doc_id"] for d in json.loads(kvdesk("--n-ctx", "1024", "attach", str(a), str(b),
                                                  "--json").stdout)]
    asked = json.loads(kvdesk("--n-ctx", "1024", "ask", "--doc", str(ids[0]), "--doc",
                              str(ids[1]), "When?", "--no-cache", "--max-tokens", "2",
                              "--json").stdout)
    assert set(asked["chunk_levels"]) == {"text"} and asked["bytes_read"] == 0
    assert asked["restore_s"] < 0.05 < asked["recompute_s"]  # nothing was restored
    assert asked["blended"]["mode"] == "exact"
    assert asked["blended"]["recomputed_tokens"] == asked["recomputed_tokens"] > 0
    assert asked["blended"]["reused_tokens"] == 0


def test_unknown_settings_keys_and_variables_are_named(monkeypatch, caplog):
    path = settings.config_dir() / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": 1, "n_ctxx": 2048, "theme": "dark"}))
    monkeypatch.setenv("KVDESK_DATADIR", "/tmp/x")
    monkeypatch.setenv("KVDESK_API_KEY", "secret")  # kvdesk's, not a setting: no warning
    with caplog.at_level(logging.WARNING, logger="kvdesk.settings"):
        loaded = settings.load()
    assert loaded.theme == "dark" and loaded.n_ctx is None
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2, warned
    assert "unknown setting 'n_ctxx' ignored (did you mean 'n_ctx'?)" in warned[0]
    assert "KVDESK_DATADIR" in warned[1] and "KVDESK_DATA_DIR" in warned[1]


def test_a_variable_is_likened_only_to_a_close_one_or_named_as_a_settings_key(monkeypatch,
                                                                               caplog):
    """KVDESK_TEMPERATURE was taken for KVDESK_DATA_DIR (the KVDESK_ they share)."""
    for var in ("KVDESK_TEMPERATURE", "KVDESK_STORAGE_BUDGET_GB", "KVDESK_REMOTE_BUKET",
                "KVDESK_WHATEVER"):
        monkeypatch.setenv(var, "9")
    with caplog.at_level(logging.WARNING, logger="kvdesk.settings"):
        settings.load()
    assert [r.getMessage().split(" ignored ", 1)[-1] for r in caplog.records] == [
        "(did you mean 'KVDESK_REMOTE_BUCKET'?)",
        "('storage_budget_gb' is a setting of the settings file, not an environment variable)",
        "('temperature' is a setting of the settings file (generation.temperature) and an "
        "option of `kvdesk ask`, not an environment variable)",
        "Warning: unknown environment variable KVDESK_WHATEVER ignored"]


def test_a_refused_value_is_said_in_kvdesks_words_whichever_check_refused_it(monkeypatch):
    """pydantic's "Input should be a valid integer, unable to parse string as an integer" was
    said beside kvdesk's own "should be an integer, not a string"."""
    monkeypatch.setenv("KVDESK_N_CTX", "abc")
    with pytest.raises(settings.SettingsError) as refused:
        settings.load()
    assert str(refused.value) == 'KVDESK_N_CTX: should be an integer (got "abc")'
    monkeypatch.delenv("KVDESK_N_CTX")
    path = settings.config_dir() / "settings.json"
    path.parent.mkdir(parents=True)
    for saved, says in (('"theme": "x"',
                         'theme: should be system, light, dark or high-contrast (got "x")'),
                        ('"storage_budget_gb": Infinity',
                         "storage_budget_gb: should be a finite number (got Infinity)"),
                        ('"n_ctx": 1000.5', "n_ctx: should be a whole number (got 1000.5)"),
                        ('"server_port": [1]', "server_port: should be an integer (got [1])"),
                        ('"remote_prefix": 5', "remote_prefix: should be a string (got 5)"),
                        ('"n_ctx": 5', "n_ctx: should be greater than or equal to 256 (got 5)")):
        path.write_text("{" + saved + "}")
        with pytest.raises(settings.SettingsError) as refused:
            settings.load()
        assert str(refused.value) == f"{path}: {says}"


@pytest.mark.parametrize(("args", "says"), [
    (["--n-ctx", "big", "docs"], '--n-ctx: should be an integer (got "big")'),
    (["gc", "--budget-gb", "x"], '--budget-gb: should be a number (got "x")'),
    (["rm", "thing", "3"], '{doc|chat}: should be doc or chat (got "thing")')])
def test_a_flags_value_is_refused_in_the_words_a_settings_is(args, says):
    """click said "Invalid value for '--budget-gb': 'x' is not a valid float."."""
    proc = subprocess.run([sys.executable, "-m", "desktop_app", *args, "--json"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and proc.stderr.startswith(f"Error: {says} (`kvdesk")
    assert json.loads(proc.stdout) == {"error": says, "kind": "UsageError"}


def test_an_empty_setting_variable_is_named_once(monkeypatch, caplog):
    """An empty KVDESK_REMOTE_ENDPOINT_URL= (a script's) meant AWS S3 without a word."""
    monkeypatch.setattr(settings, "_SAID_EMPTY", set())
    monkeypatch.setenv("KVDESK_REMOTE_BUCKET", "team-kv")
    monkeypatch.setenv("KVDESK_REMOTE_ENDPOINT_URL", "")
    with caplog.at_level(logging.WARNING, logger="kvdesk.settings"):
        loaded = settings.load()
        settings.load()
    assert loaded.remote_bucket == "team-kv" and loaded.remote_endpoint_url is None
    assert [r.getMessage() for r in caplog.records] == [
        "Warning: KVDESK_REMOTE_ENDPOINT_URL is set but empty: read as unset (the settings "
        "file's remote_endpoint_url, else AWS S3 itself)"]


def test_an_unknown_generation_key_is_named_and_ignored_like_any_setting(caplog):
    """README: an unknown settings key is named in a warning, not refused; the generation
    values are settings too (a typo there once stopped every command)."""
    path = settings.config_dir() / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": 1, "generation": {"temperatur": 0.3, "top_k": 7}}))
    with caplog.at_level(logging.WARNING, logger="kvdesk.settings"):
        loaded = settings.load()
    assert loaded.generation.top_k == 7 and loaded.generation.temperature is None
    (warned,) = [r.getMessage() for r in caplog.records]
    assert "unknown setting 'generation.temperatur' ignored (did you mean 'temperature'?)" \
        in warned


def test_a_setting_given_twice_is_said_and_the_last_one_used(caplog):
    """JSON lets an object name a key twice; which one counts is not for the user to guess."""
    path = settings.config_dir() / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_text('{"version": 1, "storage_budget_gb": 5, "storage_budget_gb": 7,'
                    ' "generation": {"top_k": 3, "top_k": 9}}')
    with caplog.at_level(logging.WARNING, logger="kvdesk.settings"):
        loaded = settings.load()
    assert loaded.storage_budget_gb == 7 and loaded.generation.top_k == 9
    warned = sorted(r.getMessage() for r in caplog.records)
    assert len(warned) == 2 and all("is given more than once: the last one is used" in w
                                    for w in warned)
    assert "'storage_budget_gb'" in warned[0] and "'top_k'" in warned[1]


def test_a_command_warns_of_an_unknown_setting_on_stderr(tmp_path):
    path = settings.config_dir() / "settings.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"version": 1, "storage_budget": 5}))
    proc = kvdesk("docs", "--json")
    assert json.loads(proc.stdout) == []  # stdout stays one JSON document
    assert "unknown setting 'storage_budget' ignored" in proc.stderr


@pytest.mark.model
def test_a_stored_lossless_level_is_read_with_or_without_a_server(tmp_path):
    """What is stored counts, not the keep_lossless setting (off here), on both paths; and a
    file attached through the server is watched for changes as one attached here is."""
    import time

    from desktop_app.server import discovery

    doc = tmp_path / "ferry.txt"
    doc.write_text("The ferry to Grey Island leaves the harbour at seven. " * 12)
    (attached,) = json.loads(kvdesk("--n-ctx", "1024", "attach", str(doc), "--levels",
                                    "lossless,high", "--json").stdout)
    ask = ("--n-ctx", "1024", "ask", str(attached["doc_id"]), "When?", "--level", "lossless",
           "--max-tokens", "2", "--json")
    local = json.loads(kvdesk(*ask, "--no-server").stdout)
    server = subprocess.Popen([sys.executable, "-m", "desktop_app", "--n-ctx", "1024", "serve",
                               "--port", "0"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            if discovery.live(tmp_path / "data") or server.poll() is not None:
                break
            time.sleep(0.1)
        served = kvdesk(*ask)
        notes = tmp_path / "notes.md"
        notes.write_text("The gate code is 4417.\n")
        through = kvdesk("--n-ctx", "1024", "attach", str(notes), "--json")
        assert "answered by the kvdesk server" in through.stderr  # (an upload, not a path)
        (uploaded,) = json.loads(through.stdout)
    finally:
        server.terminate()
        server.wait(timeout=60)
    assert "answered by the kvdesk server" in served.stderr
    notes.write_text("The gate code is 9020.\n")
    later = time.time() + 5
    os.utime(notes, (later, later))
    listed = {d["doc_id"]: d for d in json.loads(kvdesk("docs", "--json").stdout)}
    assert listed[uploaded["doc_id"]]["file_changed"]
    for answer in (local, json.loads(served.stdout)):
        assert set(answer["chunk_levels"]) == {"lossless"}, answer
        assert answer["recomputed_tokens"] == 0
        assert not any("opt-in" in m for m in answer["messages"])


def test_every_command_that_ends_takes_json():
    from desktop_app.cli import cli

    commands = [(f"{name} {sub}", c) for name, group in cli.commands.items()
                for sub, c in getattr(group, "commands", {"": group}).items()]
    lacking = [name.strip() for name, c in commands
               if not any("--json" in getattr(p, "opts", ()) for p in c.params)]
    assert sorted(lacking) == ["gui", "serve"]  # they keep running


def test_a_flag_given_an_empty_list_of_levels_is_refused_not_taken_for_the_default(tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("A line of text.")
    for args, flag in ((["attach", str(doc), "--levels", ""], "--levels"),
                       (["eval", str(doc), "--configs", " , "], "--configs")):
        proc = subprocess.run([sys.executable, "-m", "desktop_app", *args], capture_output=True,
                              text=True, timeout=120)
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith(f"Error: Invalid value for '{flag}': names no level")
    assert not (tmp_path / "data").exists()  # refused as the command line is read


def test_json_keeps_text_as_written_where_stdout_takes_utf8(monkeypatch):
    """(Every --json escaped "契約書" as "\\u5951...": unreadable in a terminal.) A stdout in a
    legacy code page (a file redirected on Windows) still gets escapes, never an error."""
    import io

    from desktop_app.cli import base

    data = {"title": "契約書 Müller"}
    for encoding, expected in (("utf-8", '{"title": "契約書 Müller"}'),
                               ("cp1252", '{"title": "\\u5951\\u7d04\\u66f8 M\\u00fcller"}')):
        monkeypatch.setattr("sys.stdout", io.TextIOWrapper(io.BytesIO(), encoding=encoding))
        assert base.json_text(data) == expected
    # a name's bytes that are not UTF-8 (os.fsdecode's surrogates): escaped, never an error
    monkeypatch.setattr("sys.stdout", io.TextIOWrapper(io.BytesIO(), encoding="utf-8"))
    assert base.json_text({"path": "caf\udce9.txt"}) == '{"path": "caf\\udce9.txt"}'
