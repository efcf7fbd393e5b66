"""Documents that do not fit the context together: answers and time to first token, each
command a fresh `kvdesk` process, as the user runs them.

    .venv/bin/python -m benchmarks.bench_fit --out fit.json
        [--kvdesk "PYTHON -m desktop_app"] [--chars 14000] [--n-ctx 8192]
        [--model NAME-OR-GGUF-PATH]

Three documents of --chars characters each (consecutive pydoc topics, none shared), a made-up
fact planted in each at 30 / 60 / 90 % of its text, each attached whole (each fits the context
alone; together they do not). Each fact is asked once in a new chat over all three
(`ask --doc 1 --doc 2 --doc 3`) and once in a chat over its document alone (read whole, from
its own cache: what a chat over that document answers), greedy, 24 tokens: whether the
answer states the fact, the time to its first token, the wall time of the process, the
passages cited, and what the answer said of the documents. `--kvdesk` is the command of the
checkout to measure (run from another checkout's folder, `python -m desktop_app` is that one's).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FACTS = [  # (sentence planted, question, what the answer must hold: one of)
    ("The Quillmoor archive key is kept in drawer 41 of the east cabinet.",
     "In which drawer is the Quillmoor archive key kept?", ("41", "forty-one")),
    ("The Varnel observatory dome was painted ochre in 1932.",
     "What colour was the Varnel observatory dome painted?", ("ochre",)),
    ("The Osterby ferry pass costs seventeen crowns a month.",
     "How much does the Osterby ferry pass cost?", ("seventeen", "17")),
]
DEPTHS = (0.3, 0.6, 0.9)


def documents(chars: int) -> list[str]:
    from pydoc_data.topics import topics

    pool = "\n\n".join(topics[k] for k in sorted(topics)).split("\n\n")
    out, i = [], 0
    for (fact, _, _), depth in zip(FACTS, DEPTHS, strict=True):
        paras, size = [], 0
        while size < chars:
            paras.append(pool[i])
            size += len(pool[i]) + 2
            i += 1
        paras.insert(int(len(paras) * depth), fact)
        out.append("\n\n".join(paras))
    return out


def run(cmd: list[str], env: dict) -> tuple[dict, float]:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout), round(time.perf_counter() - t0, 2)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kvdesk", default=f"{sys.executable} -m desktop_app")
    p.add_argument("--chars", type=int, default=14000)
    p.add_argument("--n-ctx", type=int, default=8192)
    p.add_argument("--model", default=None)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_fit_"))
    env = {**os.environ, "KVDESK_DATA_DIR": str(work / "data"),
           "KVDESK_CONFIG_DIR": str(work / "config")}
    if args.model:
        env["KVDESK_MODEL"] = args.model
    base = [*shlex.split(args.kvdesk), "--n-ctx", str(args.n_ctx)]
    ids, attached = [], []
    for n, text in enumerate(documents(args.chars)):
        path = work / f"part{n + 1}.txt"
        path.write_text(text)
        (out,), wall = run([*base, "attach", str(path), "--json"], env)
        ids.append(out["doc_id"])
        attached.append({"doc": out["doc_id"], "tokens": out["tokens"], "wall_s": wall})
    rows = []
    for (_, question, keys), doc in zip(FACTS, ids, strict=True):
        for over in ("all", "alone"):
            docs = ids if over == "all" else [doc]
            flags = [x for d in docs for x in ("--doc", str(d))]
            out, wall = run([*base, "ask", *flags, question, "--json", "--temperature", "0",
                             "--max-tokens", "24", "--no-server"], env)
            rows.append({"question": question, "over": over, "states_fact":
                         any(k in out["answer"].lower() for k in keys), "ttft_s": out["ttft_s"],
                         "wall_s": wall, "answer": out["answer"],
                         "sources": [(s["document_id"], s["index"]) for s in out["sources"]],
                         "read_whole": [d["document_id"] for d in out["read_whole"]],
                         "messages": out["messages"]})
            print(json.dumps(rows[-1])[:300], flush=True)
    result = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "load": os.getloadavg(), "cpu": platform.processor() or platform.machine(),
              "cpus": os.cpu_count(), "args": vars(args), "attached": attached, "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    for over in ("all", "alone"):
        got = [r for r in rows if r["over"] == over]
        print(over, sum(r["states_fact"] for r in got), "of", len(got), "facts stated;",
              "ttft", [r["ttft_s"] for r in got])


if __name__ == "__main__":
    main()
