"""A chat over several documents asked from the command line, one shot: the process computes
the chat's exact context after the answer (it would otherwise exit with the background pass
unfinished), so the next turn and a reopen are exact; Ctrl-C skips it, keeping the answer."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from test_blending import DOCS, QUESTION
from test_cli import kvdesk

pytestmark = pytest.mark.model
CONTEXT = ("--n-ctx", "2048")
GREEDY = ("--max-tokens", "8", "--temperature", "0")


def attach_all(tmp_path, repeat: int = 1) -> list[str]:
    ids = []
    for name, text in DOCS.items():
        (tmp_path / name).write_text(text * repeat)
        out = kvdesk(*CONTEXT, "attach", str(tmp_path / name), "--levels", "compact", "--json")
        ids.append(str(json.loads(out.stdout)[0]["doc_id"]))
    return ids


def kv_mode(chat_id: int) -> str:
    chats = json.loads(kvdesk("chats", "--json").stdout)
    return {c["chat_id"]: c["kv_mode"] for c in chats}[chat_id]


def test_a_one_shot_blended_ask_leaves_the_chat_exact(tmp_path):
    docs = [a for d in attach_all(tmp_path) for a in ("--doc", d)]
    asked = kvdesk(*CONTEXT, "ask", *docs, QUESTION, *GREEDY, "--json")
    first = json.loads(asked.stdout)
    assert first["blended"]["mode"] == "blended" and first["answer"]
    assert "the exact context is stored" in asked.stderr
    chat = first["chat_id"]
    assert kv_mode(chat) == "exact"
    reopened = kvdesk(*CONTEXT, "reopen", str(chat), "--json")
    assert "Computing" not in reopened.stderr  # nothing left to compute
    assert json.loads(reopened.stdout)["recomputed_tokens"] == 0
    again = json.loads(kvdesk(*CONTEXT, "ask", "--chat", str(chat), "And the tower?",
                              *GREEDY, "--json").stdout)
    assert again["blended"]["mode"] == "exact"


def test_ctrl_c_skips_the_exact_pass_and_keeps_the_answer(tmp_path):
    docs = [a for d in attach_all(tmp_path, repeat=3) for a in ("--doc", d)]
    proc = subprocess.Popen([sys.executable, "-m", "desktop_app", *CONTEXT, "ask", *docs,
                             QUESTION, *GREEDY, "--json"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "Computing this chat's exact context" in line:
            proc.send_signal(signal.SIGINT)
            break
    # Read on through the same buffered pipes (communicate() reads the descriptors, missing
    # what the loop above buffered), then wait.
    err = "".join(seen) + proc.stderr.read()
    out = proc.stdout.read()
    proc.wait(timeout=120)
    assert proc.returncode == 0, err
    assert "skipped: the chat stays blended" in err and "Traceback" not in err, err
    first = json.loads(out)
    assert first["answer"] and kv_mode(first["chat_id"]) == "blended"


def test_the_ctrl_c_that_stops_an_answer_skips_the_exact_pass_too(tmp_path):
    docs = [a for d in attach_all(tmp_path) for a in ("--doc", d)]
    proc = subprocess.Popen([sys.executable, "-m", "desktop_app", *CONTEXT, "ask", *docs,
                             QUESTION, "--max-tokens", "400", "--temperature", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = []
    for line in proc.stderr:  # said before the answer streams
        seen.append(line)
        if "blended from their own caches" in line:
            break
    # Stopped once the answer has begun (stopped before it, nothing of the turn is kept).
    assert proc.stdout.read(1).strip()
    proc.send_signal(signal.SIGINT)
    err = "".join(seen) + proc.stderr.read()
    proc.wait(timeout=120)
    assert proc.returncode == 0, err
    assert "Computing this chat's exact context" not in err, err
    assert "exact context was not computed (the answer was stopped)" in err, err
    assert "stopped (Ctrl-C): the answer so far is kept" in err
    assert "Traceback" not in err
