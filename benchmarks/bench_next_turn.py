"""A client's next turn through the local API: what the server computes and reads for it.

    .venv/bin/python -m benchmarks.bench_next_turn [--tokens 2000] [--conversations 3]
                                                   [--port 8792]

A client of OpenAI's API sends the whole conversation every turn. Here each conversation has
a ~`--tokens`-token system message (Python's reference, as `bench_server`'s) and a question;
its first turn is answered (32 tokens, temperature 0), then its second turn, the first's
answer and a new question appended, is sent at once, streamed, as a chat client sends it.
`kvdesk serve` runs in its own process on a fresh data directory, no background calibration.
Each conversation has a system message of its own (the reference from another offset), so
none reads another's. Per conversation: the seconds to the first token of each turn from the
client, and for the second what the `kvdesk` field says (restored, recomputed, levels read).

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

from benchmarks.bench_server import Served, document, first_token

QUESTIONS = [("What does this section describe?", "Which statement does it mention first?"),
             ("Summarize the first paragraph.", "And the second one?"),
             ("What is the main topic here?", "Give one example from the text.")]


def answered(url: str, messages: list[dict]) -> str:
    body = {"model": "default", "messages": messages, "max_tokens": 32, "temperature": 0}
    r = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600, trust_env=False)
    r.raise_for_status()
    return r.json()["choices"][0]["message"]["content"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--conversations", type=int, default=3)
    ap.add_argument("--port", type=int, default=8792)
    args = ap.parse_args()
    data = Path(tempfile.mkdtemp(prefix="kvdesk-bench-next-turn-")) / "data"
    whole = document(args.tokens * (args.conversations + 1))
    out: dict = {"load_before": os.getloadavg(), "conversations": []}
    served = Served(data, args.port)
    try:
        first_token(served.url, [{"role": "user", "content": "Hello."}])  # warms it all up
        for i in range(args.conversations):
            system = whole[i * args.tokens * 4:(i + 1) * args.tokens * 4]
            first_q, next_q = QUESTIONS[i % len(QUESTIONS)]
            messages = [{"role": "system", "content": system},
                        {"role": "user", "content": first_q}]
            t0 = time.perf_counter()
            answer = answered(served.url, messages)
            first_s = time.perf_counter() - t0
            messages += [{"role": "assistant", "content": answer},
                         {"role": "user", "content": next_q}]
            next_s, info = first_token(served.url, messages)
            out["conversations"].append({
                "first_turn_s": round(first_s, 3), "next_turn_ttft_s": round(next_s, 3),
                "restored_tokens": info.get("restored_tokens"),
                "recomputed_tokens": info.get("recomputed_tokens"),
                "chunk_levels": info.get("chunk_levels"), "messages": info.get("messages")})
            print(json.dumps(out["conversations"][-1]), flush=True)
    finally:
        served.stop()
    out["median_next_turn_ttft_s"] = statistics.median(
        c["next_turn_ttft_s"] for c in out["conversations"])
    out["load_after"] = os.getloadavg()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
