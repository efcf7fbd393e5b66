"""Nothing is left behind by a command killed (SIGKILL, at a chosen stage) or refused: no
empty chat, no document listed with no cache; and two attaches of one file at once agree.

Each kill runs the real `kvdesk` command in a subprocess and kills it once its progress on
stderr says it reached the stage (non-terminal progress prints a line per quarter).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.model,
              pytest.mark.skipif(sys.platform == "win32", reason="needs SIGKILL")]

N_CTX = "1024"
SENTENCE = "The ferry to Grey Island leaves the harbour at seven and returns at noon. "


def kvdesk(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "desktop_app", "--n-ctx", N_CTX, *args],
                          capture_output=True, text=True, timeout=300)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def listed(what: str) -> list[dict]:
    return json.loads(kvdesk(what, "--json").stdout)


def killed_at(stage: str, *args: str) -> str:
    """Run `kvdesk ARGS`, SIGKILL it when its progress reaches `stage`; its stderr so far."""
    proc = subprocess.Popen([sys.executable, "-m", "desktop_app", "--n-ctx", N_CTX, *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    seen = []
    try:
        for line in proc.stderr:
            seen.append(line)
            if f" {stage} " in f" {line}":
                proc.send_signal(signal.SIGKILL)
                break
    finally:
        proc.kill()
        proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL, "".join(seen)
    return "".join(seen)


@pytest.fixture
def document(tmp_path):
    """A document of three 256-token chunks, attached at `compact`: its id."""
    path = tmp_path / "ferry.txt"
    path.write_text(SENTENCE * 45)
    return json.loads(kvdesk("attach", str(path), "--levels", "compact",
                             "--json").stdout)[0]["doc_id"]


def test_a_new_chat_killed_during_its_restore_leaves_no_chat(document):
    # Reads throttled to a slow link, so the kill lands between chunks of the restore.
    err = killed_at("restore", "ask", str(document), "When does the ferry leave?", "--level",
                    "compact", "--bandwidth-MBps", "0.05", "--max-tokens", "4")
    assert listed("chats") == [], err
    kvdesk("gc")
    assert listed("chats") == [], err
    # The next question makes its chat, whole.
    asked = json.loads(kvdesk("ask", str(document), "When does it return?", "--max-tokens",
                              "4", "--json").stdout)
    assert [(c["chat_id"], c["messages"]) for c in listed("chats")] == [(asked["chat_id"], 2)]


def test_a_refused_question_in_a_new_chat_leaves_no_chat(document):
    refused = kvdesk("ask", str(document), "Why? " * 900, "--json", check=False)
    assert refused.returncode == 1 and "the chat is full" in json.loads(refused.stdout)["error"]
    assert "Traceback" not in refused.stderr
    assert listed("chats") == []
