"""Chats over several documents: blending their caches against a full prefill, time and quality.

    .venv/bin/python -m benchmarks.bench_blend [--model PATH] [--tokens 2000] [--sets code,prose]
                                               [--fractions 0,0.05,0.15,0.3] [--plot FILE.png]

For each set of three held-out texts of one kind (Python's standard library sources; Python's
reference manual, pydoc_data; the CPython licence), cut to ~2,000 tokens each, attached as
documents, the prefix of a chat over all three is brought into the model two ways:

    full      a prefill of the whole prefix (what `--no-cache` does)
    blended   the first document's cache, the others' caches moved into place, a fraction of
              each later document recomputed in place: its first tokens (EPIC, what kvdesk
              does), or the tokens whose first-layer keys deviate most from the full prefill's
              (CacheBlend's selection, here with the deviations taken from the full prefill:
              its best case, its cost left out)

Quality: a 256-token continuation (a question, then a held-out answer text) scored under
teacher forcing after each prefix: mean KL(full || blended) of the next-token distributions and
top-1 agreement; and whether greedy answers to the set's questions are the same. Time: to the
first token of a new chat over the three documents (engine.ask), blended vs `--no-cache`.
Prints one JSON document and, with --plot, draws recompute fraction vs KLD and time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np

from desktop_app.engine import Engine
from desktop_app.kv.blending import leading
from desktop_app.kv.levels import DEFAULT_LEVELS, EXACT
from desktop_app.kv.sources import LocalSource
from desktop_app.model.kvstate import in_position_order
from desktop_app.model.models import content_hash, resolve_model_path
from desktop_app.model.runtime import Runtime
from desktop_app.options import GenerationOptions, RestoreOptions
from store import Store

STDLIB = Path(sysconfig.get_paths()["stdlib"])
SETS = {
    "code": [STDLIB / n for n in ("textwrap.py", "shlex.py", "heapq.py")],
    "prose": ["execmodel", "compound", "import"],  # pydoc_data topics
    "licence": [STDLIB / "LICENSE.txt"],  # cut in three parts
}
QUESTIONS = {
    "code": ["Which function wraps a paragraph?", "What does shlex.split do?",
             "How is a heap kept?"],
    "prose": ["What is a code block?", "What does a with statement do?",
              "How does import find a module?"],
    "licence": ["Who may copy the software?", "Is there a warranty?",
                "What must a redistribution keep?"],
}
CONTINUATION = STDLIB / "this.py"  # held out from every set: the answer text scored


def texts(kind: str, rt: Runtime, n_tokens: int) -> list[str]:
    if kind == "prose":
        from pydoc_data.topics import topics
        raw = [topics[k] for k in SETS[kind]]
    elif kind == "licence":
        whole = SETS[kind][0].read_text()
        third = len(whole) // 3
        raw = [whole[i * third:(i + 1) * third] for i in range(3)]
    else:
        raw = [p.read_text() for p in SETS[kind]]
    return [rt.detokenize(rt.tokenize(t)[:n_tokens]) for t in raw]


def continuation(rt: Runtime, prefix_msgs: list[dict]) -> list[int]:
    """A question turn, then 256 tokens of a held-out answer text, after the prefix."""
    msgs = [*prefix_msgs, {"role": "user", "content": "Summarize the documents."}]
    before = rt.render_chat(prefix_msgs, add_generation_prompt=False)
    turn = rt.render_chat(msgs, add_generation_prompt=True)[len(before):]
    answer = rt.tokenize(CONTINUATION.read_text())[:256]
    return rt.tokenize(turn) + answer


def scored(rt: Runtime, tokens: list[int]) -> np.ndarray:
    """Log-probabilities after each of `tokens`, evaluated one at a time after the context."""
    out = []
    for t in tokens:
        rt.prefill([t])
        x = rt.logits().astype(np.float64)
        out.append(x - (np.log(np.exp(x - x.max()).sum()) + x.max()))
    return np.array(out)


def compare(full: np.ndarray, other: np.ndarray) -> dict:
    p = np.exp(full)
    kld = float(np.mean(np.sum(p * (full - other), axis=1)))
    top1 = float(np.mean(full.argmax(1) == other.argmax(1)))
    return {"kld": round(kld, 5), "top1": round(top1, 4)}


def deviation_select(full_keys: np.ndarray, blended_keys: np.ndarray, fraction: float):
    """CacheBlend's choice: per document, the tokens whose first two layers' keys moved most."""
    dev = np.linalg.norm((blended_keys[:2].astype(np.float32)
                          - full_keys[:2].astype(np.float32)), axis=(0, 2))

    def select(start: int, length: int):
        k = max(1, round(fraction * length))
        return (start + np.argsort(dev[start:start + length])[::-1][:k]).tolist()
    return select


def run_set(eng: Engine, kind: str, n_tokens: int, fractions: list[float], folder: Path) -> dict:
    rt = eng.runtime
    ids = []
    for i, text in enumerate(texts(kind, rt, n_tokens)):
        path = folder / f"{kind}-{i}.txt"
        path.write_text(text)
        ids.append(eng.attach(path, levels=["lossless", "balanced"]).doc_id)
    docs = [eng.store.document(d) for d in ids]
    layout = eng.prompter.layout(rt, docs)
    prefix = list(layout.tokens)
    cont = continuation(rt, list(layout.messages))
    out: dict = {"documents": len(ids), "prefix_tokens": len(prefix)}

    rt.reset()
    t0 = time.perf_counter()
    rt.prefill(prefix)
    out["full_prefill_s"] = round(time.perf_counter() - t0, 2)
    full_keys = in_position_order(rt.capture().sections[0]).keys
    full = scored(rt, cont)

    later = [eng.store.document_entry(d, eng.fingerprint) for d in ids[1:]]

    def blended(select, level: str) -> tuple[np.ndarray, dict]:
        options = RestoreOptions(level=level)
        source = LocalSource(eng.store, eng.fingerprint, prefix[:layout.parts[0][1]])
        t = time.perf_counter()
        _, blend = eng.session.blender.restore(rt, layout, later, source, options=options,
                                               speeds=eng.speeds, select=select)
        seconds = time.perf_counter() - t
        keys = in_position_order(rt.capture().sections[0]).keys
        return keys, {"restore_s": round(seconds, 3), **blend.as_dict(),
                      **compare(full, scored(rt, cont))}

    rows = []
    for level in ("lossless", "balanced"):
        for f in fractions:
            _, row = blended(leading(f), level)
            rows.append({"select": "leading", "fraction": f, "level": level, **row})
        if level == "lossless":
            none_keys, _ = blended(lambda s, n: (), level)
            for f in fractions[1:]:
                _, row = blended(deviation_select(full_keys, none_keys, f), level)
                rows.append({"select": "deviation", "fraction": f, "level": level, **row})
    out["rows"] = rows

    answers = []
    for q in QUESTIONS[kind]:
        gen = GenerationOptions(max_tokens=24, temperature=0)  # greedy: answers comparable
        rt.reset()
        b = eng.ask(q, doc_ids=ids, generation=gen)
        eng.exactness.idle.wait(600)  # its background pass must not share the cores below
        rt.reset()
        f = eng.ask(q, doc_ids=ids, generation=gen, restore=RestoreOptions(no_cache=True))
        answers.append({"question": q, "same": b.answer == f.answer, "ttft_blended_s": b.ttft_s,
                        "ttft_full_s": f.ttft_s})
        for res in (b, f):
            eng.delete_chat(res.chat_id)
    out["answers"] = answers
    out["ttft_speedup"] = round(np.median([a["ttft_full_s"] / a["ttft_blended_s"]
                                           for a in answers]), 1)
    return out


def plot(report: dict, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for kind, res in report["sets"].items():
        for select, style in (("leading", "-o"), ("deviation", "--x")):
            rows = [r for r in res["rows"] if r["select"] == select and r["level"] == "lossless"]
            if rows:
                xs = [r["fraction"] for r in rows]
                ax1.plot(xs, [r["kld"] for r in rows], style, label=f"{kind}, {select}")
                ax2.plot(xs, [r["restore_s"] for r in rows], style, label=f"{kind}, {select}")
        ax2.axhline(res["full_prefill_s"], color="grey", lw=0.8)
    ax1.set(xlabel="recomputed fraction of each later document", ylabel="KLD vs full prefill",
            yscale="log")
    ax2.set(xlabel="recomputed fraction", ylabel="seconds to bring the prefix in")
    ax1.legend(fontsize=7)
    fig.suptitle(report["model"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model")
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--sets", default="code,prose")
    ap.add_argument("--fractions", default="0,0.05,0.15,0.3")
    ap.add_argument("--plot")
    args = ap.parse_args()
    model = resolve_model_path(args.model)
    folder = Path(tempfile.mkdtemp(prefix="kvdesk-bench-blend-"))
    digest = content_hash(model, folder / "hashes.json")
    # Every level, lossless too: its rows measure the blend alone, without the codec's loss.
    eng = Engine(Store(folder / "data"),
                 lambda: Runtime(model, model_hash=digest, n_ctx=8192, flash_attn=True),
                 levels=(*DEFAULT_LEVELS, EXACT))
    report = {"model": model.name, "load_before": os.getloadavg(), "sets": {}}
    try:
        for kind in args.sets.split(","):
            report["sets"][kind] = run_set(eng, kind, args.tokens,
                                           [float(f) for f in args.fractions.split(",")], folder)
            # each set as it is done: a run takes an hour on a busy machine
            print(json.dumps({kind: report["sets"][kind]}), file=sys.stderr)
    finally:
        eng.close()
        eng.store.close()
    report["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=1))
    if args.plot:
        plot(report, Path(args.plot))


if __name__ == "__main__":
    main()
