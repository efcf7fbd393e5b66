"""Crash consistency: kill `attach`, `ask`, `gc`, `calibrate` and `kvdesk serve` with SIGKILL at
random points, many times, and check after each kill that the data directory is whole.

    .venv/bin/python -m benchmarks.crash_loop [--iterations 50] [--seed 1] [--data-dir DIR]
        [--commands attach,ask,gc,calibrate,serve]

A killed server dies with what it does in the background: its calibration of the codec (it
calibrates an uncalibrated model once it serves) and a blended chat's exact pass (each serve
iteration asks it, through the server, a question over two documents or in the running chat,
then kills it while it answers or computes the exact context). After every kill: the store's
verify finds nothing damaged or missing and every calibration usable, each chat's messages
alternate question/answer (a turn is stored whole or not at all; no chat is empty), `kvdesk
docs` answers and, after `gc`, lists no unfinished document, a client whose server was killed
gets an error, not a traceback, and the next question in the same chat works (no lock left
behind, nothing half-written in its way). Exits 1 and prints the failing check if any fails;
prints one JSON summary on stdout. `--commands` cycles through the commands given instead of
drawing them at random. The suite runs a few iterations (tests/test_crash_loop.py); the long
loop is this command.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from desktop_app.server import discovery
from store import Store

N_CTX = "1024"
WORDS = ("lighthouse keeper granite lamp storm harbour ferry museum tower island tide "
         "bell causeway logbook telescope winter spring salt paint door").split()


def kvdesk(data: Path, *args: str) -> subprocess.Popen:
    env = {**os.environ, "KVDESK_DATA_DIR": str(data), "KVDESK_N_CTX": N_CTX}
    return subprocess.Popen([sys.executable, "-m", "desktop_app", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finished(data: Path, *args: str) -> tuple[int, str, str]:
    proc = kvdesk(data, *args)
    out, err = proc.communicate(timeout=600)
    return proc.returncode, out, err


def document(folder: Path, rng: random.Random, n: int) -> Path:
    path = folder / f"doc-{n}.txt"
    sentences = [" ".join(rng.choice(WORDS) for _ in range(12)).capitalize() + "."
                 for _ in range(rng.randint(10, 60))]
    path.write_text(" ".join(sentences))
    return path


def check(data: Path) -> list[str]:
    """What is wrong with the data directory now (nothing: an empty list)."""
    problems = []
    with Store(data) as store:  # the store's own view, in this process: quick
        report = store.verify()
        for kind in ("corrupt", "missing"):
            if report[kind]:
                problems.append(f"verify found {kind} chunks: {report[kind]}")
        unusable = [c for c in report["calibrations"] if c["state"] != "ok"]
        if unusable:
            problems.append(f"verify found unusable calibrations: {unusable}")
        counts = store.message_counts()
        for chat in store.chats():
            n = counts.get(chat.id, 0)
            roles = [m.role for m in store.messages(chat.id)]
            if not n or n % 2 or roles != ["user", "assistant"] * (n // 2):
                problems.append(f"chat {chat.id}: messages {roles}: a turn stored in part")
    code, _, err = finished(data, "docs", "--json")  # and through the app, as users see it
    if code != 0 or "Traceback" in err:
        problems.append(f"docs: exit {code}: {err}")
    code, _, err = finished(data, "gc", "--json")
    code, out, err = finished(data, "docs", "--json") if code == 0 else (code, "[]", err)
    unfinished = [d["doc_id"] for d in json.loads(out or "[]") if d["status"] == "unfinished"]
    if code != 0 or unfinished:
        problems.append(f"after gc (exit {code}): unfinished documents {unfinished} {err}")
    return problems


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_and_kill(data: Path, rng: random.Random, chat: int, docs: list[int]) -> dict:
    """Start a server, ask it a question (over two documents: blended, then made exact in the
    background; or in the chat), kill it at a random point while it answers or after."""
    server = kvdesk(data, "serve", "--port", str(free_port()))
    deadline = time.monotonic() + 120
    while discovery.live(data) is None:
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            return {"command": "serve", "killed": False,
                    "problem": f"the server did not start: {server.communicate()[1]}"}
        time.sleep(0.2)
    question = f"What about the {rng.choice(WORDS)}?"
    ask = (["ask", "--doc", str(docs[0]), "--doc", str(docs[1]), question] if rng.random() < 0.5
           else ["ask", "--chat", str(chat), question])
    client = kvdesk(data, *ask, "--max-tokens", "16")
    time.sleep(rng.uniform(0.0, 6.0))  # mid-answer, mid-store, mid exact pass or calibration
    killed = server.poll() is None
    server.send_signal(signal.SIGKILL)
    server.communicate(timeout=60)
    _, err = client.communicate(timeout=120)
    run = {"command": "serve", "killed": killed, "blend": "--doc" in ask}
    if "Traceback" in err:
        run["problem"] = f"the server's client: {err}"
    return run


COMMANDS = ("attach", "ask", "gc", "calibrate", "serve")
DRAWN = ("attach", "ask", "ask", "gc", "calibrate", "serve", "serve")  # the random mix


def one_kill(data: Path, folder: Path, rng: random.Random, n: int, chat: int, kind: str,
             docs: list[int]) -> dict:
    """Start a command, kill it at a random point once it is under way; what was killed."""
    if kind == "serve":
        return serve_and_kill(data, rng, chat, docs)
    args = {"attach": ["attach", str(document(folder, rng, n))],
            "ask": ["ask", "--chat", str(chat), f"What about the {rng.choice(WORDS)}?",
                    "--max-tokens", "24"],
            "gc": ["gc", "--budget-gb", f"{rng.uniform(0, 0.002):.6f}"],
            "calibrate": ["calibrate", "--force"]}[kind]
    proc = kvdesk(data, *args)
    # Most of a command's first second is loading the model: the interesting points are after
    # (a calibration runs for minutes: anywhere in its first half minute).
    time.sleep(rng.uniform(1.0, 30.0 if kind == "calibrate" else 5.0))
    killed = proc.poll() is None
    if killed:
        proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    return {"command": kind, "killed": killed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data-dir", type=Path)
    parser.add_argument("--commands", type=lambda v: v.split(","),
                        help=f"cycle through these, of {','.join(COMMANDS)} (default: random)")
    args = parser.parse_args(argv)
    if args.commands and not set(args.commands) <= set(COMMANDS):
        parser.error(f"--commands: choose among {','.join(COMMANDS)}")
    rng = random.Random(args.seed)
    folder = Path(tempfile.mkdtemp(prefix="kvdesk-crash-"))
    data = args.data_dir or folder / "data"
    # Two documents, for the chats over several documents a server blends.
    code, out, err = finished(data, "attach", str(document(folder, rng, 0)),
                              str(document(folder, rng, -1)), "--json")
    if code != 0:
        print(err, file=sys.stderr)
        return 1
    docs = [d["doc_id"] for d in json.loads(out)]
    doc_id = docs[0]
    code, out, err = finished(data, "ask", str(doc_id), "What is it about?", "--max-tokens", "8",
                              "--json")
    chat = json.loads(out)["chat_id"]
    runs, t0 = [], time.time()
    for n in range(1, args.iterations + 1):
        kind = args.commands[(n - 1) % len(args.commands)] if args.commands \
            else rng.choice(DRAWN)
        runs.append(one_kill(data, folder, rng, n, chat, kind, docs))
        problems = [runs[-1]["problem"]] if "problem" in runs[-1] else []
        problems += check(data)
        # The same chat and the first document still work after the kill.
        code, _, err = finished(data, "ask", "--chat", str(chat), "And then?", "--max-tokens", "4")
        if code != 0 and "the chat is full" in err:
            # Tens of turns fill the 1,024-token context (said clearly): go on in a new chat.
            code, out, err = finished(data, "ask", str(doc_id), "What is it about?",
                                      "--max-tokens", "8", "--json")
            chat = json.loads(out)["chat_id"] if code == 0 else chat
        if code != 0:
            problems.append(f"the next ask in chat {chat} failed: {err}")
        if problems:
            print(json.dumps({"iteration": n, "after": runs[-1], "problems": problems},
                             indent=2))
            return 1
    print(json.dumps({"iterations": len(runs), "killed": sum(r["killed"] for r in runs),
                      "by_command": {k: sum(r["command"] == k for r in runs)
                                     for k in COMMANDS},
                      "blended_via_server": sum(r.get("blend", False) for r in runs),
                      "seconds": round(time.time() - t0, 1), "all_consistent": True}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
