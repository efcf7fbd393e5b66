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

With `--slide TURNS` (and `--n-ctx`, e.g. 2048) a client's conversation grows past the context
turn by turn, as a chat tool sends it to a streamed /api/chat (its whole history each time,
the answers it got appended): a history filling most of the context, then TURNS questions of
~100 tokens. Each turn: the messages left out, the prompt's tokens held (restored or already in
the model) and computed, the time to the first token, and the store's size after it; with the
load and the CPU. `--checkout DIR` serves another checkout's kvdesk (the one before a change).

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
import sys
import tempfile
import time
from pathlib import Path

import httpx

from .bench_server import QUESTION, Served, document, first_token


def ollama_first_token(url: str, messages: list[dict]) -> tuple[float, dict]:
    """Seconds to the first line with content of a streamed /api/chat, and kvdesk's field."""
    ttft, last, _ = ollama_turn(url, messages, num_predict=8)
    return ttft, last.get("kvdesk", {})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--port", type=int, default=8792)
    ap.add_argument("--history", type=int, default=0)
    ap.add_argument("--slide", type=int, default=0)
    ap.add_argument("--n-ctx", type=int, default=2048)
    ap.add_argument("--checkout", help="the kvdesk checkout to serve (default: this one)")
    args = ap.parse_args()
    data = Path(tempfile.mkdtemp(prefix="kvdesk-bench-ollama-")) / "data"
    if args.slide:
        return slide(data, args)
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


def slide(data: Path, args: argparse.Namespace) -> None:
    """A conversation growing past the context, a turn at a time (the module's --slide)."""
    history = [{"role": "system", "content": "You are a careful assistant who keeps track of "
                "the lockers and what each of them holds."}]
    for i in range(int(args.n_ctx * 0.8) // 100):  # (~100 tokens a turn)
        history += [{"role": "user", "content": f"Locker {i} holds the {WORDS[i % 7]} "
                     f"parcel number {i * 37 % 101}. " * 4 + "Please remember it."},
                    {"role": "assistant", "content": f"Noted: locker {i} holds the "
                     f"{WORDS[i % 7]} parcel number {i * 37 % 101}. " * 2}]
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text()
                .splitlines() if line.startswith("model name")), "")
    out: dict = {"checkout": args.checkout or ".", "n_ctx": args.n_ctx, "cpu": cpu,
                 "cores": os.cpu_count(), "load_before": os.getloadavg(), "turns": []}
    server = Served(data, args.port, n_ctx=args.n_ctx, cwd=args.checkout)
    try:
        for t in range(args.slide + 1):  # (the first: the history computed, not timed)
            history.append({"role": "user", "content": f"Locker {100 + t} holds the "
                            f"{WORDS[t % 7]} parcel number {t * 53 % 97}. " * 4
                            + f"What does locker {t} hold?"})
            ttft, said, text = ollama_turn(server.url, history)
            history.append({"role": "assistant", "content": text})
            info = said.get("kvdesk", {})
            left = [m for m in info.get("messages", []) if " oldest " in m]
            out["turns"].append({
                "turn": t, "messages": len(history) - 1,
                "left_out": int(left[0].split(" oldest ")[0].rsplit(" ", 1)[1]) if left
                else 0, "prompt": said.get("prompt_eval_count"),
                "held": info.get("restored_tokens"), "computed": info.get("recomputed_tokens"),
                "ttft_s": round(ttft, 2), "stored": info.get("stored"),
                "store_mb": round(sum(f.stat().st_size for f in data.glob("kvdesk.sqlite*"))
                                  / 1e6, 1), "load": round(os.getloadavg()[0], 2)})
            print(json.dumps(out["turns"][-1]), file=sys.stderr, flush=True)
    finally:
        server.stop()
    past = [r for r in out["turns"][1:] if r["left_out"]]
    out["past_context"] = {
        "turns": len(past), "mostly_computed": sum(r["computed"] > r["prompt"] / 2
                                                   for r in past),
        "median_ttft_s": statistics.median(r["ttft_s"] for r in past) if past else None,
        "median_held_share": statistics.median(r["held"] / r["prompt"] for r in past)
        if past else None}
    out["load_after"] = os.getloadavg()
    print(json.dumps(out, indent=2))


def ollama_turn(url: str, messages: list[dict], num_predict: int = 24
                ) -> tuple[float, dict, str]:
    """A streamed /api/chat turn: seconds to its first content, the last line, the answer."""
    body = {"model": "default", "messages": messages, "stream": True,
            "options": {"num_predict": num_predict, "temperature": 0}}
    t0, ttft, last, text = time.perf_counter(), None, {}, []
    with httpx.stream("POST", f"{url}/api/chat", json=body, timeout=1200,
                      trust_env=False) as r:
        for line in r.iter_lines():
            if line:
                last = json.loads(line)
                text.append(last.get("message", {}).get("content", ""))
                if ttft is None and text[-1]:
                    ttft = time.perf_counter() - t0
    return ttft if ttft is not None else time.perf_counter() - t0, last, "".join(text)


WORDS = ("red", "green", "blue", "brass", "paper", "velvet", "iron")


if __name__ == "__main__":
    main()
