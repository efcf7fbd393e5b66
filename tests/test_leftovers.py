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
import time

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
    assert refused.returncode == 1  # the question alone is over the context: said so
    assert "too long for the 1,024-token context" in json.loads(refused.stdout)["error"]
    assert "Traceback" not in refused.stderr
    assert listed("chats") == []


@pytest.mark.parametrize("stage", ["extract", "prefill", "encode"])
def test_a_killed_attach_leaves_an_unfinished_document_that_gc_removes(tmp_path, stage):
    path = tmp_path / "ferry.txt"
    path.write_text(SENTENCE * 45)
    err = killed_at(stage, "attach", str(path))
    docs = listed("docs")  # killed right after extraction, it may not be there at all
    assert [d["status"] for d in docs] in ([], ["unfinished"]), err
    if stage != "extract":
        assert docs, err
        said = kvdesk("docs").stdout  # the advice once, in commands
        # (no shared cache here: pulling it is no advice to give; probe 119)
        assert "did not finish: attach the file again (kvdesk gc removes it)" in said, said
    said = kvdesk("gc").stdout  # said, with the ids the JSON form lists
    ids = ", ".join(str(d["doc_id"]) for d in docs)
    assert (f"removed {len(docs)} document(s) whose attach or pull did not finish "
            f"and stored nothing: {ids}" in said) == bool(docs), said
    assert listed("docs") == []


def test_the_next_attach_of_the_file_finishes_a_killed_one(tmp_path):
    path = tmp_path / "ferry.txt"
    path.write_text(SENTENCE * 45)
    killed_at("encode", "attach", str(path))
    (unfinished,) = listed("docs")
    (done,) = json.loads(kvdesk("attach", str(path), "--json").stdout)
    assert done["doc_id"] == unfinished["doc_id"] and not done["reused"]
    (doc,) = listed("docs")
    assert doc["status"] == "ready" and sum(doc["cache_bytes"].values()) > 0
    assert json.loads(kvdesk("gc", "--json").stdout)["abandoned_documents"] == []
    assert json.loads(kvdesk("verify", "--json").stdout)["corrupt"] == []


def test_two_attaches_of_one_file_at_once_agree(tmp_path):
    """The second waits for the first (a lock across processes) and takes its result."""
    path = tmp_path / "ferry.txt"
    path.write_text(SENTENCE * 45)
    procs = [subprocess.Popen([sys.executable, "-m", "desktop_app", "--n-ctx", N_CTX, "attach",
                               str(path), "--json"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        results += json.loads(out)
    assert {r["doc_id"] for r in results} == {listed("docs")[0]["doc_id"]}
    assert sorted(r["reused"] for r in results) == [False, True]
    assert len(listed("docs")) == 1 and listed("docs")[0]["status"] == "ready"


def test_a_client_whose_server_is_killed_mid_answer_gets_an_error(document, tmp_path):
    from desktop_app.server import discovery

    data = tmp_path / "data"
    server = subprocess.Popen([sys.executable, "-m", "desktop_app", "--n-ctx", N_CTX, "serve",
                               "--port", "0"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        for _ in range(600):
            if discovery.live(data) or server.poll() is not None:
                break
            time.sleep(0.1)
        assert discovery.live(data), "the server did not start"
        client = subprocess.Popen(
            [sys.executable, "-m", "desktop_app", "--n-ctx", N_CTX, "ask", str(document),
             "When?", "--level", "compact", "--bandwidth-MBps", "0.05", "--max-tokens", "4"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        seen = []
        for line in client.stderr:  # the server is restoring: kill it
            seen.append(line)
            if line.startswith("restore"):
                server.send_signal(signal.SIGKILL)
                break
        _, err = client.communicate(timeout=120)
        err = "".join(seen) + err
    finally:
        server.kill()
        server.wait(timeout=60)
    assert client.returncode == 1, err
    assert "Error: the kvdesk server at" in err and "Traceback" not in err
