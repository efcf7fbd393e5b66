"""Crash consistency: kill `attach`, `ask` and `gc` with SIGKILL at random points, many times,
and check after each kill that the data directory is whole.

    .venv/bin/python -m benchmarks.crash_loop [--iterations 50] [--seed 1] [--data-dir DIR]

After every kill: the store's verify finds nothing damaged, each chat's messages alternate
question/answer (a turn is stored whole or not at all), `kvdesk docs` answers, and the next
question in the same chat works (no lock left behind, nothing half-written in its way). Exits 1
and prints the failing check if any fails; prints one JSON summary on stdout. The suite runs a
few iterations (tests/test_crash_loop.py); the long loop is this command.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

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
        for chat_id, n in store.message_counts().items():
            roles = [m.role for m in store.messages(chat_id)]
            if n % 2 or roles != ["user", "assistant"] * (n // 2):
                problems.append(f"chat {chat_id}: messages {roles}: a turn stored in part")
    code, _, err = finished(data, "docs", "--json")  # and through the app, as users see it
    if code != 0 or "Traceback" in err:
        problems.append(f"docs: exit {code}: {err}")
    return problems


def one_kill(data: Path, folder: Path, rng: random.Random, n: int, chat: int) -> dict:
    """Start a command, kill it at a random point once it is under way; what was killed."""
    kind = rng.choice(["attach", "ask", "ask", "gc"])
    args = {"attach": ["attach", str(document(folder, rng, n))],
            "ask": ["ask", "--chat", str(chat), f"What about the {rng.choice(WORDS)}?",
                    "--max-tokens", "24"],
            "gc": ["gc", "--budget-gb", f"{rng.uniform(0, 0.002):.6f}"]}[kind]
    proc = kvdesk(data, *args)
    # Most of a command's first second is loading the model: the interesting points are after.
    time.sleep(rng.uniform(1.0, 5.0))
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
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    folder = Path(tempfile.mkdtemp(prefix="kvdesk-crash-"))
    data = args.data_dir or folder / "data"
    code, out, err = finished(data, "attach", str(document(folder, rng, 0)), "--json")
    if code != 0:
        print(err, file=sys.stderr)
        return 1
    doc_id = json.loads(out)[0]["doc_id"]
    code, out, err = finished(data, "ask", str(doc_id), "What is it about?", "--max-tokens", "8",
                              "--json")
    chat = json.loads(out)["chat_id"]
    runs, t0 = [], time.time()
    for n in range(1, args.iterations + 1):
        runs.append(one_kill(data, folder, rng, n, chat))
        problems = check(data)
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
                                     for k in ("attach", "ask", "gc")},
                      "seconds": round(time.time() - t0, 1), "all_consistent": True}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
