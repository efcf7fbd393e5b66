"""Finding an old chat by what was said in it: the store's search of titles and messages,
`kvdesk chats --search` and `--limit`, and the window's chat search."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from test_store_helpers import open_store


def _library(path):
    store = open_store(path)
    older = store.create_chat("Warranty terms")
    store.add_message(older.id, "user", "How long is the warranty?")
    store.add_message(older.id, "assistant", "The WARRANTY lasts seven years from delivery.")
    newer = store.create_chat("Opening hours")
    store.add_message(newer.id, "user", "When does the Straße office open?")
    store.add_message(newer.id, "assistant", "At 9:00, " + "and it stays open late. " * 10
                      + "Ring the bell twice.")
    store.add_message(newer.id, "user", "Does the warranty office open then too?")
    store.create_chat("Empty chat about the warranty")
    return store, older.id, newer.id


def test_the_store_finds_chats_by_title_or_message_in_any_case(tmp_path):
    store, older, newer = _library(tmp_path / "d")
    with store:
        found = store.chats_holding("warranty")
        # the chat whose message came latest first; each with its latest message holding it
        assert list(found)[:2] == [newer, older]
        assert found[newer] == "Does the warranty office open then too?"
        assert found[older] == "The WARRANTY lasts seven years from delivery."
        empty = next(c.id for c in store.chats() if c.title.startswith("Empty"))
        assert found[empty] == ""  # its title alone
        assert set(store.chats_holding("STRASSE")) == {newer}  # casefolded: "Straße"
        assert store.chats_holding("  stays   open  ")[newer].endswith("…")  # a line of it
        long = store.chats_holding("Bell  TWICE")[newer]  # the words around it, at its end
        assert long.startswith("…") and long.endswith("Ring the bell twice.") and len(long) <= 91
        assert store.chats_holding("nowhere said") == {}


@pytest.mark.model
def test_chats_search_and_limit_on_the_command_line(tmp_path):
    _library(tmp_path / "d")[0].close()

    def chats(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "desktop_app", "--data-dir",
                               str(tmp_path / "d"), "chats", *args], capture_output=True,
                              text=True, timeout=300)

    said = chats("--search", "seven years").stdout.splitlines()
    assert said == ["[1] Warranty terms — 2 messages",
                    "    “The WARRANTY lasts seven years from delivery.”"]
    rows = json.loads(chats("--search", "warranty", "--json").stdout)
    assert [r["chat_id"] for r in rows] == [3, 2, 1] and rows[0]["found"] == ""
    assert chats("--limit", "1").stdout.splitlines() == [
        "[3] Empty chat about the warranty — 0 messages", "and 2 earlier chats (--limit)"]
    assert chats("--search", "zebra").stdout == "no chat holds “zebra”\n"
    bad = chats("--limit", "0")
    assert bad.returncode == 1 and "--limit" in bad.stderr and "Traceback" not in bad.stderr


def test_a_search_for_nothing_is_refused(tmp_path):
    from click.testing import CliRunner

    from desktop_app.cli import cli

    result = CliRunner().invoke(cli, ["--data-dir", str(tmp_path), "chats", "--search", "  "])
    assert result.exit_code != 0 and "give the words to look for" in result.output
