"""A model load prints nothing of llama.cpp's and silences no other thread (`llamalog`)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from desktop_app.model.models import default_model_path

ROOT = Path(__file__).resolve().parents[1]

# Another thread writes to file descriptor 1 and to sys.stdout all through a model load; then
# the script says how many lines it wrote and how many llama.cpp log lines reached logging.
SCRIPT = textwrap.dedent("""
    import logging, os, sys, threading, time
    from desktop_app.model.runtime import Runtime
    from desktop_app.model.models import default_model_path
    seen = []
    class Keep(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())
    logging.getLogger("kvdesk.llama").addHandler(Keep())
    logging.getLogger("kvdesk.llama").setLevel(logging.DEBUG)
    stop, sent = threading.Event(), [0]
    def talk():
        while not stop.is_set():
            sent[0] += 1
            os.write(1, f"fd {sent[0]}\\n".encode())
            print(f"py {sent[0]}", flush=True)
            time.sleep(0.001)
    t = threading.Thread(target=talk)
    t.start()
    Runtime(default_model_path(), model_hash="test", n_ctx=256)
    stop.set()
    t.join()
    print("sent", sent[0], "logged", len(seen), any("llama" in m for m in seen), file=sys.stderr)
""")


@pytest.fixture(scope="module")
def run():
    if not default_model_path().exists():
        pytest.skip("no model")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)


def test_other_threads_output_survives_a_model_load(run):
    assert run.returncode == 0, run.stderr
    sent = int(run.stderr.split("sent ")[1].split()[0])
    lines = run.stdout.splitlines()
    assert sent > 10
    assert sum(line.startswith("fd ") for line in lines) == sent
    assert sum(line.startswith("py ") for line in lines) == sent


def test_llama_cpp_lines_go_to_logging_not_the_terminal(run):
    *before, last = run.stderr.strip().splitlines()
    assert before == []  # no banner, no llama.cpp line on stderr
    assert last.endswith("True") and int(last.split("logged ")[1].split()[0]) > 0
    assert not [line for line in run.stdout.splitlines() if not line.startswith(("fd ", "py "))]


def test_a_quiet_thread_leaves_the_stream_text_for_click(monkeypatch):
    """click probes a stream with write(b"") and caches what it found: a quiet thread's echo
    must not make it take stderr for a binary stream (a Ctrl-C during a load then ended in
    "write() argument must be str, not bytes")."""
    import io
    import threading

    import click

    from desktop_app.model.llamalog import _ThreadFilter

    quiet, inner = threading.local(), io.StringIO()
    monkeypatch.setattr(sys, "stderr", _ThreadFilter(inner, quiet))
    quiet.on = True
    click.echo("dropped", err=True)
    quiet.on = False
    click.echo("cancelled; nothing was stored", err=True)
    assert inner.getvalue() == "cancelled; nothing was stored\n"
