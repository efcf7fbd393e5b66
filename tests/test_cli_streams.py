"""A one-shot command as a script runs it: its output closed, on a full disk or read by a
reader that stops (`| head`), its stderr closed, and the signals that stop it (Ctrl-C while
it starts, SIGTERM from `timeout` or systemd). One clear line, never a traceback, nothing
stored lost to the script, and the exit status README's "Exit statuses" names."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from desktop_app.cli.process import STOPPED_EARLY

KVDESK = [sys.executable, "-m", "desktop_app"]
full_disk = pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")


def shell(redirect: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`kvdesk ARGS REDIRECT` under sh, as a script's line runs it (`>&-` closes stdout)."""
    return subprocess.run(["sh", "-c", f'"$@" {redirect}', "sh", *KVDESK, *args], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("redirect,why", [
    pytest.param("> /dev/full", "No space left on device", marks=full_disk),
    (">&-", "stdout is closed")])
def test_an_output_that_cannot_be_written_is_one_error_line(redirect, why):
    done = shell(redirect, "docs", "--json")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert f"Error: cannot write the output: {why}\n" in done.stderr


def test_a_closed_stderr_changes_nothing_but_what_it_would_say():
    done = shell("2>&-", "docs", "--json")
    assert done.returncode == 0 and json.loads(done.stdout) == []


@pytest.mark.parametrize("args", [["docs"], ["chats", "--json"], ["--help"]])
def test_a_reader_that_stops_reading_ends_every_command_with_status_141(args):
    """As a process SIGPIPE ends (`git log | head`): not 1, which `set -o pipefail` reads as
    a failure; and nothing said, as nothing failed."""
    proc = subprocess.Popen([*KVDESK, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    proc.stdout.close()  # (gone before the command, still importing, writes a word)
    err = proc.communicate(timeout=120)[1]
    assert proc.returncode == 141 and "Error" not in err and "Traceback" not in err, err


# `kvdesk` stopped by a signal as its commands' modules import (the first half second of
# every command): the signal is sent as click, which only they import, begins importing.
_STARTING = """
import os, signal, sys
SIGNAL = getattr(signal, sys.argv[1])
class Signal:
    def find_spec(self, name, path=None, target=None):
        if name == "click":
            os.kill(os.getpid(), SIGNAL)
sys.meta_path.insert(0, Signal())
sys.argv = ["kvdesk", *sys.argv[2:]]
from desktop_app.cli import run
run()
"""


def _defaults() -> None:
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


@pytest.mark.parametrize("sig,status", [("SIGINT", 130), ("SIGTERM", 143)])
def test_a_signal_while_the_command_starts_ends_it_quietly(sig, status):
    # (a shell's background job, as CI may run the suite, ignores Ctrl-C, and so does a child
    # of it: kvdesk keeps a signal its parent ignores, so the child gets the default back)
    done = subprocess.run([sys.executable, "-c", _STARTING, sig, "docs", "--json"],
                          capture_output=True, text=True, timeout=120, preexec_fn=_defaults)
    assert done.returncode == status and "Traceback" not in done.stderr, done.stderr
    assert json.loads(done.stdout) == {"error": STOPPED_EARLY, "kind": "Cancelled"}


class Library:
    """A data directory holding one short document, for the commands below."""

    def __init__(self, root: Path):
        self.data = root / "data"
        self.env = {**os.environ, "KVDESK_CONFIG_DIR": str(root / "config"),
                    "KVDESK_DATA_DIR": str(self.data)}
        self.doc_id = 0

    def args(self, *args: str) -> list[str]:
        return [*KVDESK, "--n-ctx", "1024", *args]

    def popen(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(self.args(*args), env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)

    def json(self, *args: str):
        return json.loads(subprocess.run(self.args(*args, "--json"), env=self.env, check=True,
                                         capture_output=True, timeout=120).stdout)

    def kept_chat(self, err: str) -> int:
        """The chat `ask` said the answer is kept in, which holds the question and it."""
        said = err.split("is kept, in chat ")[1]
        chat_id = int(said.split(" ")[0])
        assert chat_id in {c["chat_id"] for c in self.json("chats")}
        return chat_id


@pytest.fixture(scope="module")
def library(tmp_path_factory, model_path) -> Library:
    root = tmp_path_factory.mktemp("streams")
    lib = Library(root)
    doc = root / "bridge.txt"
    doc.write_text("The Delta Bridge is 420 metres long. It opened in 1931 and carries a "
                   "railway and a road across the river delta. " * 6)
    # attached with stderr closed (`2>&-`, as a daemon's wrapper may leave it): its JSON and
    # status as ever (it failed, silent, for want of a stderr to draw its progress on)
    done = shell("2>&-", "--n-ctx", "1024", "attach", str(doc), "--json", env=lib.env)
    assert done.returncode == 0, done.stderr
    lib.doc_id = json.loads(done.stdout)[0]["doc_id"]
    return lib


def test_an_answer_its_reader_stops_reading_is_kept_as_ctrl_c_keeps_it(library):
    """`kvdesk ask ... | head -c 30`: the answer stops at once and is kept, and where is said;
    it was thrown away, with status 0."""
    proc = library.popen("ask", "--max-tokens", "200", str(library.doc_id),
                         "Describe the bridge in detail.")
    assert proc.stdout.read(1)  # the answer has begun
    proc.stdout.close()
    err = proc.communicate(timeout=120)[1].decode()
    assert proc.returncode == 141 and "Traceback" not in err, err
    answer = library.json("export", str(library.kept_chat(err)))["messages"][-1]
    assert answer["role"] == "assistant" and answer["text"]
    assert answer["stats"]["finish_reason"] == "cancelled"


@full_disk
def test_an_answer_whose_output_fails_says_which_chat_keeps_it(library):
    done = shell("> /dev/full", "--n-ctx", "1024", "ask", str(library.doc_id), "How long?",
                 "--max-tokens", "3", "--json", env=library.env)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert "Error: cannot write the output: No space left on device" in done.stderr
    library.kept_chat(done.stderr)


def test_sigterm_stops_an_answer_as_ctrl_c_does_keeping_it(library):
    proc = library.popen("ask", "--max-tokens", "200", str(library.doc_id),
                         "Describe the bridge in detail.")
    assert proc.stdout.read(1)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=120)[1].decode()
    assert proc.returncode == 0 and "stopped (SIGTERM): the answer so far is kept" in err, err
