"""The kvdesk command line: JSON on stdout, clear errors, no tracebacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from desktop_app.cli.maintenance import STOPPED_CALIBRATING


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
    # The model's trained context (this machine has the memory), and said so.
    assert info["n_ctx"] == 8192 and "trained context" in info["n_ctx_reason"]
    assert info["flash_attn"] is True and info["sliding_window_layers"] == 0
    assert info["kv_bytes_per_token"] == 23_040
    assert len(info["fingerprint"]) == 32
    assert info["data_dir"] == str(Path(os.environ["KVDESK_DATA_DIR"]).resolve())
    assert info["settings_file"] == os.path.join(os.environ["KVDESK_CONFIG_DIR"],
                                                 "settings.json")


def test_missing_model_is_one_clear_line(tmp_path):
    proc = kvdesk("--model", str(tmp_path / "nope.gguf"), "info", "--json", check=False)
    assert proc.returncode == 1
    assert json.loads(proc.stdout)["error"].startswith("model file not found")
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("Error: model file not found")
    assert "it was given by --model: leave that out for the default model" in proc.stderr


def test_a_missing_model_says_where_it_was_set_and_what_lists_without_it(tmp_path,
                                                                         monkeypatch):
    """A model set but not found is said with where it was set (the settings file, named;
    KVDESK_MODEL) and the way back; docs and chats still list, info says where things are."""

    from store import Store

    with Store(os.environ["KVDESK_DATA_DIR"]) as store:
        cached = store.add_document("h1", "Cached", "Some text.", type="txt", n_tokens=3)
        store.add_document("h2", "Never cached", "Other text.", type="txt", n_tokens=3)
        store.register_model("another-model", "/other.gguf", {})
        with store.write_entry("another-model", range(3), levels=("high",),
                               document_id=cached.id) as writer:
            for span in writer.spans:
                writer.put_chunk(span.chunk_index, "high", b"bytes")
        store.add_message(store.create_chat("About it", [cached.id]).id, "user", "hi")
    settings = Path(os.environ["KVDESK_CONFIG_DIR"]) / "settings.json"
    settings.parent.mkdir(parents=True, exist_ok=True)
    settings.write_text(json.dumps({"model": str(tmp_path / "gone.gguf")}))
    where = f'it is set as "model" in {settings}: remove that key'
    docs = kvdesk("docs", "--json")
    assert [d["status"] for d in json.loads(docs.stdout)] == ["unknown", "none"]
    assert "so which documents are cached for it is unknown" in docs.stderr and where in docs.stderr
    listed = kvdesk("docs").stdout
    assert "cache status unknown: the model set is not found or cannot be used\n" in listed
    assert "MB cached" not in listed  # (no cache under this model: not "0.0 MB cached" too)
    assert kvdesk("chats").stdout.startswith("[1] About it")
    info = kvdesk("info", check=False)
    assert info.returncode == 1 and f"settings_file: {settings}" in info.stdout
    assert info.stderr.startswith("Error: model file not found") and where in info.stderr
    monkeypatch.setenv("KVDESK_MODEL", str(tmp_path / "also-gone.gguf"))
    ask = kvdesk("ask", "1", "hi", check=False)
    assert ask.returncode == 1 and "also-gone.gguf" in ask.stderr
    assert "it is set by the environment variable KVDESK_MODEL: unset it" in ask.stderr



def test_a_title_the_locales_encoding_lacks_is_printed_escaped(monkeypatch):
    """Under a Latin-1 locale a title in Chinese (attached under UTF-8) is printed escaped,
    as stderr prints it, never a traceback (PYTHONIOENCODING: stdout as that locale's)."""
    from store import Store

    with Store(os.environ["KVDESK_DATA_DIR"]) as store:
        doc = store.add_document("h1", "山.md", "Some text.", type="txt", n_tokens=3)
        store.create_chat("山 notes", [doc.id])
    monkeypatch.setenv("PYTHONIOENCODING", "latin-1")
    listed = kvdesk("chats", check=False)
    assert listed.returncode == 0 and listed.stdout.startswith("[1] \\u5c71 notes"), listed.stderr



def test_titles_with_control_characters_are_one_escaped_line_in_plain_output():
    """(`kvdesk docs | grep` read "new<LF>line.txt" as two rows, and a chat's title rang the
    terminal's bell.) --json keeps the real titles."""
    from store import Store

    with Store(os.environ["KVDESK_DATA_DIR"]) as store:
        doc = store.add_document("h1", "new\nline.txt", "Some text.", type="txt", n_tokens=3)
        store.create_chat("Bell \a and \x1b[31mred", [doc.id])
    docs, chats = kvdesk("docs").stdout, kvdesk("chats").stdout
    assert docs.startswith("[1] new\\nline.txt — 3 tokens, ") and "\nline.txt" not in docs
    assert chats.startswith("[1] Bell \\x07 and \\x1b[31mred — ") and "\a" not in chats
    assert json.loads(kvdesk("docs", "--json").stdout)[0]["title"] == "new\nline.txt"
    assert json.loads(kvdesk("chats", "--json").stdout)[0]["title"] == "Bell \a and \x1b[31mred"


def test_a_malformed_command_line_is_one_error_line_and_json_with_json(tmp_path):
    proc = kvdesk("--data-dir", str(tmp_path), "passages", "1", "-k", "0", "--json",
                  check=False)
    assert proc.returncode == 1
    assert json.loads(proc.stdout) == {"error": json.loads(proc.stdout)["error"],
                                       "kind": "UsageError"}
    assert "-k" in json.loads(proc.stdout)["error"]
    (line,) = proc.stderr.splitlines()
    assert line.startswith("Error: ") and "`kvdesk passages -h` for help" in line
    assert not kvdesk("ask", "--bogus", check=False).stdout  # no --json: nothing on stdout
    # A level's name in capitals is the level (the names are lower case); an unknown one is
    # still refused.
    upper = kvdesk("--data-dir", str(tmp_path), "ask", "1", "Why?", "--level", "COMPACT",
                   "--json", check=False)  # (the level is checked before the document)
    assert json.loads(upper.stdout)["error"] == "no document 1"
    bad = kvdesk("--data-dir", str(tmp_path), "ask", "1", "Why?", "--level", "SUPERB",
                 check=False)
    assert "unknown level(s) superb" in bad.stderr and "auto" in bad.stderr
    # How to retrieve, without anything to retrieve for: said, not ignored.
    wide = kvdesk("--data-dir", str(tmp_path), "passages", "1", "--wide", check=False)
    assert wide.returncode == 1 and "give --query too" in wide.stderr
    # A title or a mistyped id where the document's id goes: said which word is wrong.
    titled = kvdesk("--data-dir", str(tmp_path), "ask", "manual.pdf", "Why?", check=False)
    assert titled.returncode == 1
    assert "'manual.pdf' is not a document id (`kvdesk docs` lists them)" in titled.stderr
    # An option of kvdesk itself after the command: said where it goes.
    late = kvdesk("remote", "status", "--data-dir", str(tmp_path), check=False)
    assert late.returncode == 1 and "--data-dir is an option of kvdesk itself: it goes " \
        "before the command (`kvdesk --data-dir ... remote status ...`)" in late.stderr


def test_gui_without_display_explains_headless_use(monkeypatch):
    env = {k: v for k, v in __import__("os").environ.items()
           if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    proc = subprocess.run([sys.executable, "-m", "desktop_app", "gui"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert "No display found" in proc.stderr and "kvdesk attach" in proc.stderr


@pytest.mark.parametrize("checkout", [True, False])
def test_gui_without_qt_says_how_to_get_the_window(monkeypatch, capsys, checkout):
    """A display is there but Qt is not: how to install the window, and no "No display"."""
    from desktop_app import launcher

    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")
    monkeypatch.setitem(sys.modules, "ui.main", None)  # (importing it: an ImportError)
    monkeypatch.setattr(launcher, "in_checkout", lambda: checkout)
    assert launcher.launch(None) == 1
    said = capsys.readouterr().err
    assert said.startswith("The desktop window is not available in this installation (")
    assert ("`make venv` in the checkout installs it" if checkout else
            "`pip install 'PySide6-Essentials<6.12,>=6.7'`") in said  # (the gui extra's pin)
    assert "No display found" not in said and "kvdesk attach FILE" in said


def test_an_attach_that_compiles_the_codec_says_so_first(monkeypatch, capsys):
    """Where no stamp shows the kernels compiled (a pip install), a note, before the wait."""
    from types import SimpleNamespace

    from codec.jit import jitcache
    from desktop_app.cli.base import COMPILING, say_compiling

    app = SimpleNamespace(engine=SimpleNamespace(levels=("high", "compact")))
    asked = []
    monkeypatch.setattr(jitcache, "kernels_cached", lambda levels: asked.append(levels))
    say_compiling(app)
    assert asked == [["high", "compact"]]
    assert capsys.readouterr().err == f"Note: {COMPILING}\n" and "once" in COMPILING
    monkeypatch.setattr(jitcache, "kernels_cached", lambda levels: True)
    say_compiling(app)
    assert capsys.readouterr().err == ""


@pytest.mark.model
def test_attach_ask_reopen_end_to_end(tmp_path):
    good = tmp_path / "notes.md"
    good.write_text("# Notes\n\nThe access code for the garden shed is 4417. "
                    "The spare key is under the blue flowerpot.")
    bad = tmp_path / "photo.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))

    # One bad file never stops the others; the exit status still says something failed.
    proc = kvdesk("attach", str(bad), str(good), "--levels", "high,compact", "--json",
                  check=False)
    assert proc.returncode == 1
    failure, attached = json.loads(proc.stdout)
    assert failure["source"] == str(bad) and "PNG image" in failure["error"]
    assert set(attached) >= {"doc_id", "title", "tokens", "kept_tokens", "prefill_s",
                             "encode_s", "raw_bytes", "stored_bytes"}
    assert set(attached["stored_bytes"]) == {"high", "compact"}
    assert "Traceback" not in proc.stderr
    made = "kvdesk made its data directory"  # (said by the command that made it, only)
    assert f"{made}, {os.environ['KVDESK_DATA_DIR']}:" in proc.stderr

    doc = str(attached["doc_id"])
    asked = kvdesk("ask", doc, "What is the access code?", "--max-tokens", "16", "--json")
    ans = json.loads(asked.stdout)
    assert made not in asked.stderr
    assert set(ans) == {"chat_id", "answer", "ttft_s", "restore_s", "bytes_read",
                        "chunk_levels", "recomputed_tokens", "tokens_generated", "source",
                        "messages", "documents", "blended", "sources", "recompute_s",
                        "evidence", "finish_reason", "read_whole", "stored", "model"}
    assert ans["documents"] == [attached["doc_id"]] and ans["blended"] is None
    assert ans["chunk_levels"] == ["high"] and ans["recomputed_tokens"] == 0
    assert ans["source"] == "local" and ans["model"].endswith(".gguf")
    assert ans["bytes_read"] > 0 and ans["tokens_generated"] > 0

    assert ans["finish_reason"] == ("length" if ans["tokens_generated"] == 16 else "stop")

    chat = str(ans["chat_id"])
    # One token: greedy answers differ between CPUs, and any longer limit may meet an answer
    # the model ends first; no answer to a question is empty.
    proc = kvdesk("ask", "--chat", chat, "Where is the key? Say it in a long sentence.",
                  "--max-tokens", "1", "--level", "compact", "--json")
    more = json.loads(proc.stdout)
    assert more["chat_id"] == ans["chat_id"] and set(more["chunk_levels"]) == {"compact"}
    # one token cannot hold that answer: cut at the limit, and the user told so
    assert more["tokens_generated"] == 1 and more["finish_reason"] == "length"
    assert "Note: the answer stopped at its limit of 1 token (" in proc.stderr

    rep = json.loads(kvdesk("reopen", chat, "--json").stdout)
    assert set(rep) == {"chat_id", "tokens", "restore_s", "chunk_levels", "recomputed_tokens",
                        "recompute_s", "messages"}
    assert rep["recomputed_tokens"] == 0 and len(rep["chunk_levels"]) >= 2

    assert [d["doc_id"] for d in json.loads(kvdesk("docs", "--json").stdout)] == [
        attached["doc_id"]]
    assert json.loads(kvdesk("chats", "--json").stdout)[0]["messages"] == 4
    exported = kvdesk("export", chat).stdout
    assert exported.startswith("# What is the access code?\n")
    assert f"**kvdesk ({ans['model']}):**".replace("_", "\\_") in exported
    assert len(json.loads(kvdesk("export", chat, "--format", "json").stdout)["messages"]) == 4
    gone = kvdesk("export", "999", check=False)
    assert gone.returncode == 1 and "no chat 999" in gone.stderr and not gone.stdout
    verified = json.loads(kvdesk("verify", "--json").stdout)
    assert set(verified) == {"database", "entries", "chunks", "bytes", "corrupt", "missing",
                             "calibrations", "abandoned"}
    assert verified["entries"] >= 3 and verified["corrupt"] == verified["missing"] == []
    assert verified["database"] == []  # SQLite's own check found nothing
    freed = json.loads(kvdesk("gc", "--budget-gb", "0", "--json").stdout)
    assert freed["freed_bytes"] == verified["bytes"]
    # The chat about it keeps its messages: said as kept, not as deleted with it.
    assert json.loads(kvdesk("rm", "doc", doc, "--json").stdout) == {
        "deleted": "doc", "id": int(doc), "chats_kept": [int(chat)], "freed_bytes": 0}
    assert json.loads(kvdesk("docs", "--json").stdout) == []
    missing = kvdesk("ask", "--chat", "999", "hello", "--json", check=False)
    assert missing.returncode == 1 and "no chat 999" in json.loads(missing.stdout)["error"]


@pytest.mark.model
@pytest.mark.parametrize("sig,status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_ctrl_c_or_sigterm_during_attach_stores_nothing(tmp_path, sig, status):
    """SIGTERM (`timeout`, systemd) stops it as Ctrl-C does; its status tells them apart."""
    import signal

    doc = tmp_path / "long.txt"
    doc.write_text("The quick brown fox jumps over the lazy dog. " * 300)
    proc = subprocess.Popen([sys.executable, "-m", "desktop_app", "attach", str(doc),
                             "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # wait until the prefill is under way
        if "prefill" in line:
            break
    proc.send_signal(getattr(signal, sig))
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == status  # (as a shell reports a Ctrl-C: a script tells it apart)
    assert "cancelled; nothing was stored" in err and "Traceback" not in err
    assert json.loads(out) == [{"source": str(doc), "error": "cancelled; nothing was stored"}]
    assert json.loads(kvdesk("docs", "--json").stdout) == []
    assert json.loads(kvdesk("verify", "--json").stdout)["chunks"] == 0


@pytest.mark.model
@pytest.mark.parametrize("command", ["calibrate", "eval"])
def test_ctrl_c_during_calibrate_json_prints_one_json_document(command, tmp_path):
    """`eval` calibrates first too: stopped there, it says so (it said "stopped between two
    slices of a model run")."""
    import signal

    text = tmp_path / "text.txt"
    text.write_text("The keeper lit the lamp at dusk and logged the ships. " * 60)
    args = ["calibrate"] if command == "calibrate" else [
        "eval", str(text), "--prefix-tokens", "200", "--cont-tokens", "60", "--configs",
        "default-balanced"]
    proc = subprocess.Popen([sys.executable, "-m", "desktop_app", *args, "--json"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:  # wait until it is under way
        if "%" in line:
            break
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err
    assert json.loads(out) == {"error": STOPPED_CALIBRATING, "kind": "Cancelled"}


@pytest.mark.model
def test_ctrl_c_stops_a_restore_paced_to_a_slow_link(tmp_path):
    import signal
    import time

    doc = tmp_path / "d.txt"
    doc.write_text("The museum opens at nine and closes at five. " * 60)
    doc_id = json.loads(kvdesk("--n-ctx", "1024", "attach", str(doc), "--levels", "high",
                               "--json").stdout)[0]["doc_id"]
    chat = json.loads(kvdesk("--n-ctx", "1024", "ask", str(doc_id), "When?", "--max-tokens",
                             "2", "--json").stdout)["chat_id"]
    # At 1 kB/s the chunks take minutes: the Ctrl-C must not wait for them.
    proc = subprocess.Popen([sys.executable, "-m", "desktop_app", "--n-ctx", "1024", "reopen",
                             str(chat), "--level", "high", "--bandwidth-MBps", "0.001"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(5)  # the restore under way (the model loads in ~1 s)
    proc.send_signal(signal.SIGINT)
    stopped = time.monotonic()
    _, err = proc.communicate(timeout=60)
    assert time.monotonic() - stopped < 20, "the restore waited out its slow link"
    assert proc.returncode == 130 and "Traceback" not in err


@pytest.mark.model
def test_two_processes_asking_in_one_chat_take_turns(tmp_path):
    """Each answer is computed with every earlier turn in its context: the chat's stored KV
    then covers the whole conversation as the history shows it."""
    from desktop_app.app import App
    from desktop_app.settings import load

    doc = tmp_path / "d.txt"
    doc.write_text("The museum opens at nine and closes at five. Entry is free on Sundays.")
    doc_id = json.loads(kvdesk("--n-ctx", "1024", "attach", str(doc), "--levels", "compact",
                               "--json").stdout)[0]["doc_id"]
    chat = json.loads(kvdesk("--n-ctx", "1024", "ask", str(doc_id), "When does it open?",
                             "--max-tokens", "8", "--json").stdout)["chat_id"]
    procs = [subprocess.Popen([sys.executable, "-m", "desktop_app", "--n-ctx", "1024", "ask",
                               "--chat", str(chat), question, "--max-tokens", "8", "--json"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for question in ("When does it close?", "Is it ever free?")]
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    app = App(load().with_overrides(n_ctx=1024))
    try:
        roles = [m.role for m in app.engine.messages(chat)]
        assert roles == ["user", "assistant"] * 3
        session = app.engine.session
        _, tokens, notes = session.conversation(app.engine.runtime, chat)
        assert not notes  # every message's tokens were recorded under this model
        match = app.store.longest_prefix(app.engine.fingerprint, tokens, touch=False)
        assert match.n_tokens == len(tokens)
    finally:
        app.close()


def damaged_store(data_dir) -> tuple[int, str]:
    """A store (no model needed) whose entry, under a model not loaded here, lost a chunk row
    and whose calibration was damaged; (the entry's id, the calibration's id)."""
    import sqlite3

    from store import Store

    with Store(data_dir) as store:
        store.register_model("another-model", "/other.gguf", {})
        cal = store.put_calibration("another-model", b"a calibration")
        with store.write_entry("another-model", range(300), levels=("high", "compact"),
                               calibration=cal) as writer:
            for span in writer.spans:
                for level in ("high", "compact"):
                    writer.put_chunk(span.chunk_index, level, b"bytes")
    with sqlite3.connect(data_dir / "kvdesk.sqlite") as db:
        db.execute("DELETE FROM kv_chunks WHERE chunk_index = 1 AND level = 'compact'")
        db.execute("UPDATE calibrations SET data = x'00'")
    return writer.entry.id, cal


def test_an_upgrade_that_drops_prompt_caches_says_so_once(tmp_path):
    """m011 drops the local API's prompt caches of a kvdesk from before it: the command that
    upgrades the store says so, once (the next one has nothing to say)."""
    from test_store_helpers import back_to_version_10, open_store, put_entry

    with open_store(tmp_path / "data") as store:
        put_entry(store, range(500, 800))
    back_to_version_10(tmp_path / "data")
    note = ("Note: 1 cached prompt of the local API (stored /v1/responses conversations' KV "
            "among them) made by an older kvdesk was dropped: each is computed again at its "
            "next use")
    assert kvdesk("docs").stderr.splitlines() == [note]
    assert note not in kvdesk("docs").stderr


def test_verify_says_what_is_missing_and_which_calibration_is_unusable(tmp_path):
    entry, cal = damaged_store(tmp_path / "data")
    proc = kvdesk("verify", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stdout.splitlines() == [
        "1 entries, 3 chunks, 0.0 MB, 1 codec calibrations: 1 missing, 1 unusable "
        "calibrations",
        f"  missing: entry {entry} chunk 1 level compact",
        f"  calibration {cal[:12]}: damaged, needed by 1 entries",
        "run `kvdesk verify --repair` to recompute them (they are not read meanwhile)"]


@pytest.mark.model
def test_verify_repair_drops_what_another_models_entry_cannot_have_back(tmp_path):
    entry, cal = damaged_store(tmp_path / "data")
    proc = kvdesk("verify", "--repair", "--json")
    fixed = json.loads(proc.stdout)["repair"]
    # Its calibration is unusable: every level goes, and with them the entry; then the
    # calibration, which nothing needs any more.
    assert fixed["dropped"] == [{"entry": entry, "level": "high"},
                                {"entry": entry, "level": "compact"}]
    assert fixed["deleted_entries"] == [entry] and fixed["removed_calibrations"] == [cal]
    text = kvdesk("verify").stdout
    assert text.startswith("0 entries, 0 chunks, 0.0 MB, 0 codec calibrations: all intact")


def test_verify_repair_removes_a_damaged_calibration_nothing_needs(tmp_path):
    import sqlite3

    from store import Store

    with Store(tmp_path / "data") as store:
        cal = store.put_calibration("another-model", b"a calibration")
    with sqlite3.connect(tmp_path / "data" / "kvdesk.sqlite") as db:
        db.execute("UPDATE calibrations SET data = x'00'")
    assert kvdesk("verify", check=False).returncode == 1
    fixed = json.loads(kvdesk("verify", "--repair", "--json").stdout)["repair"]
    assert fixed["removed_calibrations"] == [cal] and fixed["reencoded"] == []
    assert json.loads(kvdesk("verify", "--json").stdout)["calibrations"] == []


def test_a_plain_answer_over_passages_names_its_sources_and_its_quote():
    from desktop_app.results import Source

    one = Source(7, 1, 12, "text", 0.5, lines=(120, 141), heading=("Manual", "Setup"))
    pdf = Source(9, 2, 3, "text", 0.4, page=4)
    assert Source.read([one.as_dict()], ["It is\n  7."]) == [  # a wrapped quote: one line
        "source: #12 [lines 120-141] Manual > Setup", 'quoted with the question: "It is 7."']
    assert Source.read([one.as_dict(), pdf.as_dict()], []) == [  # (the best scored marked)
        "source: document 1 #12 [lines 120-141] Manual > Setup (best match)",
        "source: document 2 #3 [page 4]"]
    assert Source.read([], []) == []
    # A document read whole beside them, by its title, first
    kept = Source(8, 1, 2, "text", 0.2, lines=(20, 24), earlier=True)
    assert Source.read([kept.as_dict()], []) == ["source: #2 [lines 20-24] (an earlier question's)"]
    notes = [{"document_id": 3, "title": "Notes"}]
    assert Source.read([one.as_dict()], [], read_whole=notes) == [
        "source: Notes (read whole)", "source: document 1 #12 [lines 120-141] Manual > Setup"]


def test_source_lines_name_their_document_by_title_wherever_it_is_known():
    from desktop_app.results import Source

    one = Source(7, 1, 12, "text", 0.5, lines=(120, 141), heading=("Manual", "Setup"))
    pdf = Source(9, 2, 3, "text", 0.4, page=4)
    titles = {1: "manual.md"}  # document 2 deleted since
    assert Source.read([one.as_dict()], [], titles) == [
        "source: manual.md #12 [lines 120-141] Manual > Setup"]
    assert Source.read([one.as_dict(), pdf.as_dict()], [], titles) == [
        "source: manual.md #12 [lines 120-141] Manual > Setup (best match)",
        "source: document 2 #3 [page 4]"]


def test_a_damaged_store_is_explained_once_when_a_command_cannot_run(tmp_path):
    import sqlite3

    from store import Store

    data = tmp_path / "data"
    with Store(data) as store:
        store.add_document("h1", "Doc", "Some text.", type="txt")
    with sqlite3.connect(data / "kvdesk.sqlite") as db:
        (root,) = db.execute("SELECT rootpage FROM sqlite_master "
                             "WHERE name = 'documents'").fetchone()
        (page_size,) = db.execute("PRAGMA page_size").fetchone()
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    with open(data / "kvdesk.sqlite", "r+b") as f:  # a rotten page in the documents' table
        f.seek((root - 1) * page_size + 8)
        f.write(b"\xff" * 200)
    doc = tmp_path / "notes.txt"
    doc.write_text("Cats sleep for about sixteen hours a day.\n")
    proc = kvdesk("attach", str(doc), check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.count("is damaged") == 1, proc.stderr  # the warning, then a short error
    assert proc.stderr.splitlines()[-1] == \
        "Error: this command cannot run here, for the reason warned of above"
