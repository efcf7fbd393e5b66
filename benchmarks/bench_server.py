"""Time to first token through the local API, as users meet it.

    .venv/bin/python -m benchmarks.bench_server [--tokens 4000] [--repeat 3] [--port 8791]

A 4,000-token document (Python's reference, pydoc_data) is the system message of a chat
completion; every figure is measured from the client (a streamed request: time to the first
content chunk), with `kvdesk serve` in its own process, on a fresh data directory:

    (a) recomputed     the first request: nothing cached, the whole prompt computed
    (b) restarted      the same request after the server process was restarted: the prompt
                       comes back from the store (the first request stored it)
    (c) one-shot ask   `kvdesk ask DOC QUESTION` as a new process through the running server,
                       from spawning it to its first answer byte on stdout; against the same
                       question asked in a warm process in-process (`Engine.ask`'s time to first
                       token, the document already loaded), and in a fresh process without a
                       server (`--no-server`)

Prints one JSON document; records the load average, which on 2 shared cores moves every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

QUESTION = "Summarize what this section of the reference says, in one sentence."


def document(n_tokens: int) -> str:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    return text[: n_tokens * 4]  # ~4 characters a token; the usage counts say exactly


class Served:
    """`kvdesk serve` in its own process: the checkout `cwd`'s (by default this one's), with a
    context of `n_ctx` tokens if given."""

    def __init__(self, data: Path, port: int, *, n_ctx: int | None = None,
                 cwd: str | None = None):
        self.url = f"http://127.0.0.1:{port}"
        # Its own settings: no background calibration competing with the requests timed.
        config = data.parent / "config"
        config.mkdir(exist_ok=True)
        # Nor a second listener on Ollama's port, which a real Ollama may hold.
        (config / "settings.json").write_text('{"calibrate_automatically": false, '
                                              '"ollama_port": null}')
        env = {**os.environ, "KVDESK_DATA_DIR": str(data), "KVDESK_CONFIG_DIR": str(config)}
        self.proc = subprocess.Popen([sys.executable, "-m", "desktop_app",
                                      *(["--n-ctx", str(n_ctx)] if n_ctx else []), "serve",
                                      "--port", str(port)], env=env, cwd=cwd,
                                     stderr=subprocess.PIPE, text=True)
        for line in self.proc.stderr:  # ready once it says it serves
            if "serves" in line:
                break
        # Keep reading what it says, so a full pipe never stalls it.
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def first_token(url: str, messages: list[dict]) -> tuple[float, dict]:
    """Seconds to the first content chunk of a streamed completion, and its kvdesk field."""
    body = {"model": "default", "messages": messages, "max_tokens": 8, "temperature": 0,
            "stream": True}
    t0, ttft, info = time.perf_counter(), None, {}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600,
                      trust_env=False) as r:
        for line in r.iter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            chunk = json.loads(line[5:])
            delta = chunk["choices"][0]["delta"] if chunk.get("choices") else {}
            if ttft is None and delta.get("content"):
                ttft = time.perf_counter() - t0
            info = chunk.get("kvdesk", info)
    return ttft, info


def one_shot(data: Path, *args: str) -> float:
    """Seconds from spawning `kvdesk ...` to its first byte on stdout."""
    env = {**os.environ, "KVDESK_DATA_DIR": str(data),
           "KVDESK_CONFIG_DIR": str(data.parent / "config")}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "desktop_app", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    proc.stdout.read(1)
    seconds = time.perf_counter() - t0
    proc.communicate(timeout=600)
    return seconds


def warm_in_process(data: Path, doc_id: int, repeat: int) -> list[float]:
    from desktop_app.app import App
    from desktop_app.options import GenerationOptions
    from desktop_app.settings import load

    app = App(load().with_overrides(data_dir=str(data)))
    try:
        one = GenerationOptions(max_tokens=8, temperature=0)  # as the served requests
        app.engine.ask(QUESTION, doc_ids=[doc_id], generation=one)  # loads and warms it all
        return [app.engine.ask(QUESTION, doc_ids=[doc_id], generation=one).ttft_s
                for _ in range(repeat)]
    finally:
        app.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--port", type=int, default=8791)
    args = ap.parse_args()
    data = Path(tempfile.mkdtemp(prefix="kvdesk-bench-server-")) / "data"
    text = document(args.tokens)
    messages = [{"role": "system", "content": text}, {"role": "user", "content": QUESTION}]
    out: dict = {"load_before": os.getloadavg()}

    served = Served(data, args.port)
    try:
        out["a_recomputed_s"], info = first_token(served.url, messages)
        out["a_kvdesk"] = info
    finally:
        served.stop()
    runs = []
    for _ in range(args.repeat):
        served = Served(data, args.port)  # a restart each time: an empty context
        try:
            runs.append(first_token(served.url, messages))
        finally:
            served.stop()
    out["b_restarted_s"] = statistics.median(t for t, _ in runs)
    out["b_kvdesk"] = runs[-1][1]
    out["b_speedup"] = round(out["a_recomputed_s"] / out["b_restarted_s"], 1)

    doc = Path(data.parent / "reference.txt")
    doc.write_text(text)
    served = Served(data, args.port)
    try:
        # Its own settings: no background calibration competing with the requests timed.
        config = data.parent / "config"
        config.mkdir(exist_ok=True)
        (config / "settings.json").write_text('{"calibrate_automatically": false}')
        env = {**os.environ, "KVDESK_DATA_DIR": str(data), "KVDESK_CONFIG_DIR": str(config)}
        attached = subprocess.run([sys.executable, "-m", "desktop_app", "attach", str(doc),
                                   "--json"], env=env, capture_output=True, text=True, check=True)
        doc_id = json.loads(attached.stdout)[0]["doc_id"]
        ask = ("ask", str(doc_id), QUESTION, "--max-tokens", "8")
        one_shot(data, *ask)  # the server brings the document in once
        out["c_one_shot_via_server_s"] = statistics.median(
            one_shot(data, *ask) for _ in range(args.repeat))
    finally:
        served.stop()
    out["c_one_shot_no_server_s"] = statistics.median(
        one_shot(data, *ask, "--no-server") for _ in range(args.repeat))
    out["c_warm_in_process_s"] = statistics.median(warm_in_process(data, doc_id, args.repeat))
    out["c_ratio_vs_warm"] = round(out["c_one_shot_via_server_s"] / out["c_warm_in_process_s"], 2)
    out["load_after"] = os.getloadavg()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
