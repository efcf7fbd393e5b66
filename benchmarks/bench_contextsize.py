"""The context size estimate (desktop_app.model.contextsize) against what llama.cpp allocates.

    .venv/bin/python -m benchmarks.bench_contextsize [--models default,gemma]
                                                      [--contexts 2048,8192,32768]

For each model, context size and flash attention off/on, a context is created with
llama.cpp's log on, and the sizes it reports (the KV cache's, every section; the CPU compute
buffer's) are compared with `contextsize.parts` (`estimate` counts the KV three times: the
cache, and the state buffer and capture a restore or an attach hold beside it). Prints one
JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import llama_cpp

from benchmarks.common import model_of
from desktop_app.model import contextsize, gguf_header

KV = re.compile(r"llama_kv_cache: size = +([\d.]+) MiB")
COMPUTE = re.compile(r"CPU compute buffer size = +([\d.]+) MiB")
MIB = 1 << 20


def allocated(model: Path, n_ctx: int, flash_attn: bool) -> dict:
    """llama.cpp's own report of one context: KV MiB (all sections), compute MiB."""
    with tempfile.TemporaryFile("w+") as log:
        saved = os.dup(2)
        os.dup2(log.fileno(), 2)  # llama.cpp writes its log to the process's stderr
        try:
            llm = llama_cpp.Llama(str(model), n_ctx=n_ctx, n_batch=512, flash_attn=flash_attn,
                                  swa_full=False, verbose=True)
            llm.close()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        log.seek(0)
        text = log.read()
    return {"kv_MiB": round(sum(float(m) for m in KV.findall(text)), 2),
            "compute_MiB": round(sum(float(m) for m in COMPUTE.findall(text)), 2)}


def estimated(facts: gguf_header.HeaderFacts, n_ctx: int, flash_attn: bool) -> dict:
    kv, compute = contextsize.parts(facts, n_ctx, flash_attn=flash_attn)
    return {"kv_MiB": round(kv / MIB, 2), "compute_MiB": round(compute / MIB, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="default,gemma")
    ap.add_argument("--contexts", default="2048,8192,32768")
    args = ap.parse_args()
    cache = Path(tempfile.gettempdir()) / "kvdesk-bench-models"
    cache.mkdir(exist_ok=True)
    rows = []
    for name in args.models.split(","):
        model = model_of(name, cache)
        facts = gguf_header.read(model)
        for n_ctx in (int(n) for n in args.contexts.split(",")):
            for flash in (False, True):
                got, est = allocated(model, n_ctx, flash), estimated(facts, n_ctx, flash)
                rows.append({"model": model.name, "n_ctx": n_ctx, "flash_attn": flash,
                             "llama_cpp": got, "estimate": est,
                             "kv_ratio": round(est["kv_MiB"] / got["kv_MiB"], 3)
                             if got["kv_MiB"] else None,
                             "compute_ratio": round(est["compute_MiB"] / got["compute_MiB"], 3)
                             if got["compute_MiB"] else None})
                print(json.dumps(rows[-1]), file=sys.stderr)
    print(json.dumps({"load": os.getloadavg(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
