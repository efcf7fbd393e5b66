"""What a long document's passage KV takes on disk: each passage's entry holding its own copy
of the passages' system prompt (a root, as before), against one entry of that prompt stored
once, which every passage's entry extends (`desktop_app.kv.passagekv`).

Both in one run, on the same passages: a real text (the standard library's pydoc
topics by default), its passages spread across it, computed and stored as a question's first
read does (`PassageKV.ensure`) in two fresh stores. Prints one JSON document: bytes per MB of
passage text both ways (the head's own entry counted), and the ratio.

    .venv/bin/python -m benchmarks.bench_passage_bytes [--model gemma] [--passages 40]
        [--calibration cal.kvcl | --uncalibrated]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import tempfile
from pathlib import Path
from unittest import mock

from benchmarks.common import add_calibration_flags, text_of, use_calibration
from desktop_app.engine import Engine
from desktop_app.kv.passagekv import PassageKV
from desktop_app.model.models import content_hash, resolve_model_path
from desktop_app.model.runtime import Runtime
from store import Store


def stored(model: Path, text: str, n: int, args, shared_head: bool) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        store = Store(folder / "data")
        digest = content_hash(model, folder / "hashes.json")
        eng = Engine(store, lambda: Runtime(model, model_hash=digest, n_ctx=args.n_ctx),
                     fill_passages=False, background=False)
        levels = use_calibration(eng, args)
        path = folder / "text.txt"
        path.write_text(text)
        doc = eng.attach(path).doc_id
        passages = store.passages(doc)
        chosen = passages[::max(1, len(passages) // n)][:n]
        kv = eng.session.longdocs.kv
        own = mock.patch.object(PassageKV, "_head_entry", return_value=None)
        with contextlib.nullcontext() if shared_head else own:
            ready = kv.ensure(eng.runtime, [(doc, p.text) for p in chosen])
        entries = [e for e in ready.entries if e is not None]
        heads = {e.parent_id for e in entries} - {None}
        kv_bytes = sum(e.nbytes for e in entries) + sum(store.entry(h).nbytes for h in heads)
        text_bytes = sum(len(p.text.encode()) for p in chosen)
        eng.close()
        store.close()
        return {"passages": len(entries), "heads": len(heads), "kv_bytes": kv_bytes,
                "text_bytes": text_bytes, "level": kv.level, **levels,
                "bytes_per_text_MB": round(kv_bytes / text_bytes * 1e6)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="default (SmolLM2-135M), gemma or a path")
    p.add_argument("--text", default="pydoc", help="pydoc, code or a file")
    p.add_argument("--chars", type=int, default=200_000)
    p.add_argument("--passages", type=int, default=40)
    p.add_argument("--n-ctx", type=int, default=4096)
    add_calibration_flags(p)
    args = p.parse_args()
    model = resolve_model_path(args.model)
    text = text_of(args.text)[:args.chars]
    load = os.getloadavg()
    own = stored(model, text, args.passages, args, shared_head=False)
    shared = stored(model, text, args.passages, args, shared_head=True)
    print(json.dumps({"model": str(model), "own_head": own, "shared_head": shared,
                      "shared_over_own": round(shared["kv_bytes"] / own["kv_bytes"], 3),
                      "load_average": {"before": load, "after": os.getloadavg()}}, indent=2))


if __name__ == "__main__":
    main()
