"""A quick quality probe of codec levels on the default model: KLD and top-1 vs exact KV.

    .venv/bin/python benchmarks/codec_quality_probe.py [--prefix 1024] [--next 64]

Prefills a prefix of the pydoc topics text, reads the sequence state, and for each level
restores the decoded KV (256-token chunks, as the engine stores them) into the same context,
then evaluates the next tokens one by one and compares every next-token distribution with the
exact restore: mean KL(exact || level) and top-1 agreement. A probe with few positions (noisy,
see /work/shared/notes/quality-baselines.md), not the quality evaluation itself.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time

import llama_cpp
import numpy as np

import codec
from benchmarks.record_kv import model_path, text
from desktop_app.kvstate import KVState, build_seq_state, parse_seq_state


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prefix", type=int, default=1024)
    ap.add_argument("--next", type=int, default=64)
    ap.add_argument("--extra", default="{}", help="JSON {name: config dict} to probe as well")
    args = ap.parse_args()
    p, m = args.prefix, args.next
    llm = llama_cpp.Llama(model_path=model_path(), n_ctx=p + m + 16, logits_all=True,
                          verbose=False)
    ctx = llm._ctx.ctx
    tokens = llm.tokenize(text().encode())[:p + m]
    llm.eval(tokens[:p])
    size = llama_cpp.llama_state_seq_get_size(ctx, 0)
    raw = (ctypes.c_uint8 * size)()
    got = llama_cpp.llama_state_seq_get_data(ctx, raw, size, 0)
    exact = parse_seq_state(bytes(raw)[:got])
    assert np.array_equal(exact.positions, np.arange(p))

    def run(keys: np.ndarray, values: np.ndarray) -> np.ndarray:
        state = build_seq_state(KVState(keys, values, exact.positions, exact.v_trans))
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(ctx), True)
        buf = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        assert llama_cpp.llama_state_seq_set_data(ctx, buf, len(state), 0) == len(state)
        llm.n_tokens = p
        llm.input_ids[:p] = tokens[:p]
        llm.eval(tokens[p:])
        return np.array(llm.scores[p:p + m], dtype=np.float64)

    def log_softmax(z: np.ndarray) -> np.ndarray:
        z = z - z.max(axis=1, keepdims=True)
        return z - np.log(np.exp(z).sum(axis=1, keepdims=True))

    ref = log_softmax(run(exact.keys, exact.values))
    configs = {**codec.levels(), **json.loads(args.extra)}
    results = {}
    for name, cfg in configs.items():
        t = time.perf_counter()
        blobs = codec.encode_chunks(exact.keys, exact.values, cfg)
        keys, values = codec.decode_chunks(blobs)
        lp = log_softmax(run(keys, values))
        kld = float((np.exp(ref) * (ref - lp)).sum(axis=1).mean())
        top1 = float((lp.argmax(axis=1) == ref.argmax(axis=1)).mean())
        bpe = sum(len(b) for b in blobs) * 8 / (keys.size + values.size)
        results[name] = {"bits_per_element": round(bpe, 3), "kld": round(kld, 4),
                         "top1": round(top1, 3)}
        print(f"{name:<14} bits/elem {bpe:6.3f}  KLD {kld:.4f}  top-1 {top1:.3f}  "
              f"({time.perf_counter() - t:.1f} s)", flush=True)
    print(json.dumps({"prefix": p, "next": m, "levels": results}))


if __name__ == "__main__":
    main()
