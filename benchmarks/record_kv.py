"""Record a real KV cache of the default model (SmolLM2-135M) for codec benchmarks and fixtures.

Prefills the start of the standard library's pydoc topics text (all topics in sorted order)
through `desktop_app.model.runtime.Runtime`, reads the sequence state through
`desktop_app.model.kvstate`
(f16 cache) and saves keys and values as float16 [n_layer, n_tokens, channels], position order.

    .venv/bin/python -m benchmarks.record_kv --tokens 4096 --out benchmarks/data/kv4096.npz
    .venv/bin/python -m benchmarks.record_kv --source benchmarks/data/kv4096.npz --tokens 300 \
        --layers 0,1,14,29 --fixture --out tests/fixtures/codec/real_kv.npz
"""

from __future__ import annotations

import argparse
import os

import numpy as np

from desktop_app.model import kvstate
from desktop_app.model.models import default_model_path
from desktop_app.model.runtime import Runtime


def text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def record(n_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    rt = Runtime(default_model_path(), model_hash="record", n_ctx=n_tokens + 16)
    try:
        tokens = rt.tokenize(text(), add_bos=True, special=False)[:n_tokens]
        if len(tokens) != n_tokens:
            raise SystemExit(f"the text has only {len(tokens)} tokens")
        rt.prefill(tokens)
        kv = kvstate.in_position_order(rt.capture().sections[0])
    finally:
        rt.close()
    return kv.keys, np.ascontiguousarray(kv.values)


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
