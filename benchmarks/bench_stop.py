"""How long stopping takes while background work runs: `kvdesk serve` stopped by SIGTERM during
its codec calibration, and an app (the window's, the server's) closed while a chat's exact
pass computes beside the passage pass.

- `serve`: a fresh data directory (so the server calibrates the codec in the background), the
  server started, SIGTERM sent `--after` seconds after it says it serves; the time from the
  signal to the process's exit.
- `close`: an app with background work on (as the window runs it) attaches a long text (the
  pydoc topics: kept as passages), asks a question in a new chat and a follow-up (blended:
  its exact context is then computed in the background), and is closed at once; the time
  `App.close` takes.

    .venv/bin/python -m benchmarks.bench_stop [--rounds 3] [--after 30] [--what serve,close]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def stop_serve(after: float, port: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "KVDESK_DATA_DIR": f"{tmp}/data", "KVDESK_CONFIG_DIR": f"{tmp}/cfg"}
        proc = subprocess.Popen([sys.executable, "-m", "desktop_app", "serve", "--port",
                                 str(port)], env=env, stderr=subprocess.PIPE, text=True)
        for line in proc.stderr:
            if line.startswith("kvdesk serves"):
                break
        time.sleep(after)
        t = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=300)
        return time.perf_counter() - t


def close_app() -> float:
    import pydoc_data.topics

    from desktop_app import settings
    from desktop_app.app import App
    from desktop_app.options import GenerationOptions

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["KVDESK_DATA_DIR"], os.environ["KVDESK_CONFIG_DIR"] = f"{tmp}/data", f"{tmp}/c"
        text = Path(tmp, "topics.txt")
        text.write_text("\n\n".join(pydoc_data.topics.topics.values()))
        app = App(settings.load(), background=True)
        eng = app.engine
        eng.warm_up()
        doc = eng.attach(text).doc_id
        short = GenerationOptions(max_tokens=8, temperature=0)
        first = eng.ask("What does the with statement do?", doc_ids=[doc], generation=short)
        eng.ask("And what does the nonlocal statement do?", chat_id=first.chat_id,
                generation=short)
        t = time.perf_counter()
        app.close()
        return time.perf_counter() - t


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--after", type=float, default=30.0)
    ap.add_argument("--port", type=int, default=18941)
    ap.add_argument("--what", default="serve,close")
    args = ap.parse_args(argv)
    out: dict = {"load": [round(x, 2) for x in os.getloadavg()]}
    what = args.what.split(",")
    if "serve" in what:
        out["serve_stop_s"] = [round(stop_serve(args.after, args.port), 2)
                               for _ in range(args.rounds)]
    if "close" in what:
        out["app_close_s"] = [round(close_app(), 2) for _ in range(args.rounds)]
    out["load_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
