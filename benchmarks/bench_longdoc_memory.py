"""Peak memory of attach and ask on a long text against a document that fits, as a user runs
them: each a fresh one-shot `kvdesk` process on a data directory of its own.

    .venv/bin/python -m benchmarks.bench_longdoc_memory [--long-chars 3000000]
                                                        [--short-chars 17000] [--max-tokens 16]

The long text is the standard library's source (`bench_retrieval`'s `code` haystack, no facts
planted), cut to `--long-chars` characters: split into passages, indexed and embedded at
attach, answered from its passages' KV (computed on the first ask, stored, blended; read back
on the second). The short one is Python's reference manual (pydoc topics) cut to
`--short-chars` characters (~4,000 tokens): prefilled and stored at attach, restored at ask.
Every command is `kvdesk attach|ask --no-server --json` with KVDESK_DATA_DIR set to the text's
own fresh directory, default model and context; its peak resident set is the kernel's
ru_maxrss of that process (os.wait4), its wall time from start to exit.

Prints one JSON document: per text and command the peak RSS (MB) and seconds; per command the
long text's peak over the short one's (goal: at most 1.5).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.bench_retrieval import source
from benchmarks.common import text_of

QUESTIONS = {"short": "What does the assert statement do?",
             "long": "How does the argparse module parse its arguments?"}


def run(args: list[str], data_dir: Path) -> dict:
    """One kvdesk command in a fresh process: peak RSS, seconds, its JSON."""
    env = {**os.environ, "KVDESK_DATA_DIR": str(data_dir)}
    kvdesk = Path(sys.executable).with_name("kvdesk")
    t0 = time.perf_counter()
    proc = subprocess.Popen([str(kvdesk), *args, "--no-server", "--json"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - t0
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"kvdesk {' '.join(args)} failed: {out[-2000:]}")
    return {"peak_rss_MB": round(usage.ru_maxrss / 1024, 1), "seconds": round(seconds, 1),
            "out": json.loads(out)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--long-chars", type=int, default=3_000_000)
    p.add_argument("--short-chars", type=int, default=17_000)
    p.add_argument("--max-tokens", type=int, default=16)
    args = p.parse_args()
    texts = {"short": text_of("pydoc")[:args.short_chars],
             "long": source("code")[:args.long_chars]}
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in texts.items():
            folder = Path(tmp) / name
            folder.mkdir()
            path = folder / f"{name}.txt"
            path.write_text(text)
            data = folder / "data"
            attach = run(["attach", str(path)], data)
            doc = attach["out"][0]  # (one result per file attached)
            ask = ["ask", str(doc["doc_id"]), QUESTIONS[name], "--temperature", "0",
                   "--max-tokens", str(args.max_tokens)]
            first, again = run(ask, data), run(ask, data)
            rows[name] = {"chars": len(text), "bytes": len(text.encode()),
                          "tokens": doc.get("tokens"), "passages": doc.get("passages"),
                          **{k: {"peak_rss_MB": r["peak_rss_MB"], "seconds": r["seconds"]}
                             for k, r in (("attach", attach), ("ask", first),
                                          ("ask_again", again))},
                          "answer": again["out"].get("answer")}
            print(json.dumps({name: rows[name]}), file=sys.stderr, flush=True)
    ratios = {k: round(rows["long"][k]["peak_rss_MB"] / rows["short"][k]["peak_rss_MB"], 2)
              for k in ("attach", "ask", "ask_again")}
    print(json.dumps({"texts": rows, "long_over_short_peak_rss": ratios}, indent=2))


if __name__ == "__main__":
    main()
