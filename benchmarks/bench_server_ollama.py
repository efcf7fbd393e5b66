"""Time to first token through Ollama's API on the local server, and its prompt cache shared
with OpenAI's chat completions.

    .venv/bin/python -m benchmarks.bench_server_ollama [--tokens 4000] [--repeat 3] [--port 8792]
    .venv/bin/python -m benchmarks.bench_server_ollama --history 400

The same 4,000-token document as `bench_server` (Python's reference) is the system message of a
streamed `/api/chat` request; each figure is measured from the client (time to the first line
with content), with `kvdesk serve` in its own process, on a fresh data directory:

    (a) recomputed     the first request: nothing cached, the whole prompt computed
    (b) restarted      the same /api/chat request after a server restart: the prompt comes
                       back from the store (the first request stored it)
    (c) via OpenAI     after another restart, the same conversation sent to
                       /v1/chat/completions: the cache /api/chat stored serves it too

With `--history TURNS` it measures instead a conversation of that many turns (each about
100 tokens, far more than the context holds) sent whole to a non-streamed /api/chat, which
answers it as Ollama does, its oldest messages left out: the seconds to the answer, how many
messages were left out, and the model's context.

Prints one JSON document with the load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from .bench_server import QUESTION, Served, document, first_token


def ollama_first_token(url: str, messages: list[dict]) -> tuple[float, dict]:
    """Seconds to the first line with content of a streamed /api/chat, and kvdesk's field."""
    body = {"model": "default", "messages": messages, "stream": True,
            "options": {"num_predict": 8, "temperature": 0}}
    t0, ttft, last = time.perf_counter(), None, {}
    with httpx.stream("POST", f"{url}/api/chat", json=body, timeout=600,
                      trust_env=False) as r:
        for line in r.iter_lines():
            if not line:
                continue
            last = json.loads(line)
            if ttft is None and last.get("message", {}).get("content"):
                ttft = time.perf_counter() - t0
    return ttft, last.get("kvdesk", {})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--port", type=int, default=8792)
    ap.add_argument("--history", type=int, default=0)
    args = ap.parse_args()
    data = Path(tempfile.mkdtemp(prefix="kvdesk-bench-ollama-")) / "data"
    if args.history:
        return long_history(data, args.port, args.history)
    messages = [{"role": "system", "content": document(args.tokens)},
                {"role": "user", "content": QUESTION}]
    out: dict = {"load_before": os.getloadavg()}

    def served(measure):
        server = Served(data, args.port)  # a new process each time: an empty context
        try:
            return measure(server.url, messages)
        finally:
            server.stop()

    out["a_recomputed_s"], out["a_kvdesk"] = served(ollama_first_token)
    runs = [served(ollama_first_token) for _ in range(args.repeat)]
    out["b_restarted_s"] = statistics.median(t for t, _ in runs)
    out["b_kvdesk"] = runs[-1][1]
    out["b_speedup"] = round(out["a_recomputed_s"] / out["b_restarted_s"], 1)
    out["c_via_openai_s"], out["c_kvdesk"] = served(first_token)
    out["c_speedup"] = round(out["a_recomputed_s"] / out["c_via_openai_s"], 1)
    out["load_after"] = os.getloadavg()
    print(json.dumps(out, indent=2))


def long_history(data: Path, port: int, turns: int) -> None:
    history = [m for i in range(turns) for m in (
        {"role": "user", "content": f"What sails from pier {i}? " + "Tell me more. " * 30},
        {"role": "assistant", "content": f"The ferry {i} sails from pier {i}. " * 12})]
    history.append({"role": "user", "content": "Which ferry sails from pier 3?"})
    body = {"model": "default", "messages": history, "stream": False,
            "options": {"num_predict": 8, "temperature": 0}}
    out: dict = {"load_before": os.getloadavg(), "messages": len(history)}
    server = Served(data, port)
    try:
        t0 = time.perf_counter()
        said = httpx.post(f"{server.url}/api/chat", json=body, timeout=3600,
                          trust_env=False).json()
        out["answer_s"] = round(time.perf_counter() - t0, 2)
        out["notes"] = [m for m in said["kvdesk"]["messages"] if "oldest" in m]
        out["prompt_eval_count"] = said["prompt_eval_count"]
    finally:
        server.stop()
    out["load_after"] = os.getloadavg()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
