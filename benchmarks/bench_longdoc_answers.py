"""Whether answers over a long document state its planted facts, against the model's ceiling.

    .venv/bin/python -m benchmarks.bench_longdoc_answers [--model default|gemma|PATH]
        [--size 100000] [--kinds docs,code,markdown] [--seeds 0] [--targets 160]
        [--rules focused] [--exact] [--alone] [--n-ctx 4096] [--max-tokens 32] [--k K]
        [--passage-level balanced] [--blend-fraction 0.05] [--calibration CAL.kvcl]
        [--no-quote] [--no-quote-kv]

The haystacks and facts of `bench_retrieval` (a fact about invented names planted at each
depth 0, 10 ... 100 %, asked for in other words; `--seeds` draws other names, numbers and
places, so each seed is 11 more facts a kind). Each haystack is attached as a user attaches
a file (longer than the context: split into passages of about `--targets` tokens, indexed
and embedded), and each fact's question asked in a new chat over it (temperature 0): its
passages retrieved by each of `--rules` (`focused`: the app's, for a question naming
something rare the passages holding the most of its rare words; `wide`: always the k best;
`any-rare`: the app's before, every passage holding one; `weighted`: each word counted
1/(its passages); `best`: the focused passages' best-scored alone); their KV computed or
read back (stored at `--passage-level`) and blended (`--blend-fraction` of each later
passage recomputed), the question computed (its turn quoting the sentences of those
passages that name what it asks about, as the app's does; `--no-quote`: without them).
Beside it, the model's ceiling: the same question asked in a new chat over a document
holding only the fact's paragraph (asked once a fact, whatever the size or rule); with
`--alone`, over a document holding only the fact's passage (at each size: what the ceiling
would be if the passage, not the sentence, were the yardstick); with `--exact`, the same
passages computed exactly from their text (`--no-cache`), to tell the blend's approximation
from the model's reading of many passages. Per fact: whether the fact's passage is among the
answer's sources, whether the answer states the fact (contains every value the fact gives: a
number, a name, a time), and whether the others do; the passages read and the fact's (by
index), and a miss's cause (`cause`: not read, missed by the exact reading too, or by the
restored KV alone).

Prints a JSON line per question, then one JSON document with, per size and rule, each rate as
k of n: `sources_hit` (goal >= 0.95) and `states_where_ceiling_does` (goal >= 0.90), the
latter by passages read and its misses by cause; and per
size what the passages cost: passages and KV tokens per MB of text (each passage's KV holds
its own copy of the system prompt) and the stored bytes per MB that makes at the passage
level (from the bytes a KV token of this run's stored passages took).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks.bench_retrieval import facts_with_answers, haystack
from benchmarks.common import adopt_calibration, model_of
from desktop_app.engine import Engine
from desktop_app.kv.passagekv import DEFAULT_PASSAGE_LEVEL
from desktop_app.model.models import content_hash
from desktop_app.model.prompts import passage_prefix, with_evidence
from desktop_app.model.runtime import Runtime
from desktop_app.options import GenerationOptions, RestoreOptions
from desktop_app.passages.retrieve import RARE_PASSAGES, Hit, Retriever, focused
from desktop_app.settings import DEFAULT_BLEND_FRACTION
from store import Store


def states(answer: str, values: list[str]) -> bool:
    text = answer.lower()
    return all(v.lower() in text for v in values)


def rare_holders(store: Store, doc_id: int, question: str) -> dict[str, set[int]]:
    """{rare word of the question (in at most RARE_PASSAGES passages): the passages holding
    it}, as the retriever reads rare words."""
    counts = store.passage_frequencies(doc_id, question, RARE_PASSAGES + 1)
    return {w: {p.id for p, _ in store.search_passages(doc_id, w, RARE_PASSAGES)}
            for w, c in counts.items() if 0 < c <= RARE_PASSAGES}


def any_rare(app: Retriever, doc_id: int, question: str, **kw) -> list[Hit]:
    """The focus before `most_named`: every passage of the head of the fused ranking
    (`focused`), each holding one rare word of the question or more."""
    hits = app.retrieve(doc_id, question, **(kw | {"focus": False}))
    counts = app.store.passage_frequencies(doc_id, question, RARE_PASSAGES + 1)
    rare = [w for w, c in counts.items() if 0 < c <= RARE_PASSAGES]
    if not kw.get("focus") or not rare or len(rare) == len(counts):  # (as `Retriever`)
        return hits
    keep = {pid for pid, _ in focused([(h.passage_id, h.score) for h in hits])}
    return [h for h in hits if h.passage_id in keep]


def weighted(app: Retriever, doc_id: int, question: str, **kw) -> list[Hit]:
    """Of the app's focused passages, those holding the most of the question's rare words,
    each word counted 1/(the passages holding it): a word in one passage points at it alone,
    a word in three at each a third (tried against `most_named`'s plain count)."""
    hits = app.retrieve(doc_id, question, **kw)
    holders = rare_holders(app.store, doc_id, question)
    if not kw.get("focus") or not holders:
        return hits
    mass = {h.passage_id: sum(1 / len(ids) for ids in holders.values() if h.passage_id in ids)
            for h in hits}
    best = max(mass.values(), default=0)
    return [h for h in hits if mass[h.passage_id] >= best - 1e-9] if best else hits


def best(app: Retriever, doc_id: int, question: str, **kw) -> list[Hit]:
    """Of the app's focused passages, the best-scored alone: its ties on rare words broken by
    the fused score (tried against keeping every tie)."""
    hits = app.retrieve(doc_id, question, **kw)
    return hits[:1] if kw.get("focus") and rare_holders(app.store, doc_id, question) else hits


# The app's retrieval (`focused`, or `wide`: always the k best) and experiments beside it.
RULES: dict[str, Callable[..., list[Hit]] | None] = {
    "focused": None, "wide": None, "any-rare": any_rare, "weighted": weighted, "best": best}


class Narrowed:
    """The app's retriever, its focus replaced by an experimental rule."""

    def __init__(self, inner: Retriever, rule: Callable[..., list[Hit]]):
        self.inner = inner
        self.rule = rule

    def retrieve(self, doc_id: int, question: str, **kw) -> list[Hit]:
        return self.rule(self.inner, doc_id, question, **kw)


def cause(row: dict) -> str | None:
    """Why an answer misses (None: it states the fact): `not_read` (the fact's passage was
    not among those read), `exact_misses` (read exactly from their text, the same passages
    miss too: the context, its layout or the prompt, not the KV), `blend` (exact states it,
    the blended or restored KV does not: the blend or the codec); `unknown` without
    `--exact`."""
    if row["states"]:
        return None
    if not row["source_hit"]:
        return "not_read"
    if "exact_states" not in row:
        return "unknown"
    return "blend" if row["exact_states"] else "exact_misses"


def causes(rows: Sequence[dict]) -> dict:
    """The misses where the ceiling states the fact, by cause, and by passages read."""
    pool = [r for r in rows if r["ceiling_states"] and r["cause"]]
    by: dict[str, dict] = {}
    for r in pool:
        at = by.setdefault(r["cause"], {"n": 0, "by_passages": {}})
        at["n"] += 1
        at["by_passages"][r["passages"]] = at["by_passages"].get(r["passages"], 0) + 1
    return by


def rate(rows: Sequence[dict], key: str, where: str | None = None) -> dict:
    pool = [r for r in rows if where is None or r[where]]
    k = sum(bool(r[key]) for r in pool)
    return {"k": k, "n": len(pool), "rate": round(k / len(pool), 3) if pool else None}


class Size:
    """An engine and store whose long documents are split at one passage size."""

    def __init__(self, folder: Path, model: Path, digest: str, args, target: int):
        folder.mkdir()
        self.folder = folder
        self.store = Store(folder / "data")
        self.eng = Engine(self.store, lambda: Runtime(model, model_hash=digest,
                                                      n_ctx=args.n_ctx), fill_passages=False,
                          passage_level=args.passage_level, blend_fraction=args.blend_fraction)
        if target:
            self.eng.retriever.index.target = target
        self.target = self.eng.retriever.index.target
        if args.k is not None:
            self.eng.session.longdocs.top_k = args.k
        self.eng.session.longdocs.quote = not args.no_quote
        self.eng.session.blender.repeat = not args.no_quote_kv
        self.app = self.eng.session.longdocs.retriever
        self.docs: list[int] = []
        self.chars = 0
        self.eng.warm_up()
        if args.calibration:  # the model's levels as `kvdesk calibrate` made them elsewhere
            adopt_calibration(self.eng, args.calibration)

    def attach(self, name: str, text: str, suffix: str = ".txt") -> int:
        path = self.folder / f"{name}{suffix}"
        path.write_text(text)
        self.docs.append(self.eng.attach(path).doc_id)
        self.chars += len(text)
        return self.docs[-1]

    def ask_over(self, name: str, text: str, question: str, generation: GenerationOptions):
        """`question` in a new chat over a document holding only `text` (read whole)."""
        path = self.folder / f"{name}.txt"
        path.write_text(text + "\n")
        return self.eng.ask(question, doc_ids=[self.eng.attach(path).doc_id],
                            generation=generation)

    def ask(self, doc_id: int, question: str, generation: GenerationOptions, rule: str,
            restore: RestoreOptions = RestoreOptions()):
        """`question` asked over document `doc_id`, its passages retrieved by `rule`."""
        longdocs = self.eng.session.longdocs
        longdocs.focus = rule != "wide"
        longdocs.retriever = Narrowed(self.app, RULES[rule] or (
            lambda app, doc, q, **kw: app.retrieve(doc, q, **kw)))
        try:
            return self.eng.ask(question, doc_ids=[doc_id], generation=generation,
                                restore=restore)
        finally:
            longdocs.retriever = self.app

    def costs(self) -> dict:
        """What this size's passages cost per MB of text: passages, KV tokens (the passage's
        own and its copy of the system prompt) and, at the bytes a KV token of the passages
        stored in this run took, the store's bytes if every passage's KV were stored."""
        rt = self.eng.runtime
        passages = [p for d in self.docs for p in self.store.passages(d)]
        kv_tokens = sum(len(self.eng.session.longdocs.kv.tokens(rt, p.text)) for p in passages)
        stored = [e for e in self.store.entries() if e.passage]
        per_token = sum(e.nbytes for e in stored) / max(1, sum(e.token_end for e in stored))
        mb = self.chars / 1e6
        return {"passages_per_MB": round(len(passages) / mb),
                "tokens_per_passage": round(sum(p.tokens for p in passages)
                                            / max(1, len(passages)), 1),
                "prefix_tokens_per_passage": len(passage_prefix(rt, "").tokens),
                "kv_tokens_per_MB": round(kv_tokens / mb),
                "kv_bytes_per_token": round(per_token, 1),
                "kv_MB_per_MB": round(kv_tokens * per_token / 1e6 / mb, 2)}

    def close(self) -> None:
        self.eng.close()
        self.store.close()


def ask_all(runs: list[Size], cases, rules: list[str], args, greedy: GenerationOptions,
            rows: list[dict]) -> None:
    """Each case's facts asked at each size by each rule, a JSON line each (into `rows`)."""
    for seed, kind in cases:
        planted = facts_with_answers(random.Random(f"{seed}-{kind}-{args.size}"))
        text = haystack(kind, args.size, [(f, q) for f, q, _ in planted])
        if text is None:
            continue
        # (Source code as a user attaches it: a .py file, split at its definitions.)
        docs = [run.attach(f"{kind}-{seed}", text, ".py" if kind == "code" else ".txt")
                for run in runs]
        for i, (fact, question, values) in enumerate(planted):
            row = {"kind": kind, "seed": seed, "depth": i / (len(planted) - 1),
                   "question": question, "values": values}
            out = runs[0].ask_over(f"{kind}-{seed}-fact-{i}", fact, question, greedy)
            row["ceiling_states"], row["ceiling_answer"] = states(out.answer, values), \
                out.answer
            for run, doc in zip(runs, docs, strict=True):
                sized = dict(row, target=run.target)
                if args.alone:
                    own = next(p.text for p in run.store.passages(doc) if fact in p.text)
                    out = run.ask_over(f"{kind}-{seed}-passage-{i}", own, question, greedy)
                    sized["alone_states"] = states(out.answer, values)
                    sized["alone_answer"] = out.answer
                where = {p.text: p.index for p in run.store.passages(doc)}
                for rule in rules:
                    out = run.ask(doc, question, greedy, rule)
                    one = dict(sized, rule=rule, states=states(out.answer, values),
                               source_hit=any(fact in s["text"] for s in out.sources),
                               passages=len(out.sources), answer=out.answer,
                               fact_passage=next(i for t, i in where.items() if fact in t),
                               read=[where.get(s["text"]) for s in out.sources])
                    if args.exact:
                        exact = run.ask(doc, question, greedy, rule,
                                        RestoreOptions(no_cache=True))
                        one["exact_states"] = states(exact.answer, values)
                        one["exact_answer"] = exact.answer
                    if out.evidence:  # the turn quoted its evidence (`passages.evidence`)
                        asked = with_evidence(question, out.evidence)
                        tokenize = run.eng.runtime.tokenize
                        one["asked"] = asked
                        one["added_tokens"] = len(tokenize(asked)) - len(tokenize(question))
                    one["cause"] = cause(one)
                    rows.append(one)
                    print(json.dumps(one), flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="default",
                   help="default (SmolLM2-135M), gemma (Gemma 3 270M) or a GGUF path")
    p.add_argument("--models-dir", default=str(Path.home() / ".cache" / "kvdesk" / "models"),
                   help="where gemma is assembled on first use")
    p.add_argument("--size", type=int, default=100_000)
    p.add_argument("--kinds", default="docs,code,markdown")
    p.add_argument("--seeds", default="0", help="comma-separated: 11 facts a kind each")
    p.add_argument("--targets", default=None,
                   help="comma-separated passage sizes in tokens (default: the app's)")
    p.add_argument("--rules", default="focused", help=f"comma-separated, of {', '.join(RULES)}")
    p.add_argument("--exact", action="store_true", help="also read the passages exactly")
    p.add_argument("--calibration", default=None,
                   help="a `kvdesk calibrate` result for this model, adopted (its levels)")
    p.add_argument("--alone", action="store_true", help="also ask over the fact's passage alone")
    p.add_argument("--n-ctx", type=int, default=4096)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--k", type=int, default=None, help="passages retrieved per question "
                   "(default: the app's)")
    p.add_argument("--passage-level", default=DEFAULT_PASSAGE_LEVEL,
                   choices=["lossless", "high", "balanced", "compact"],
                   help="the level passages' KV is stored at (lossless: the blend alone)")
    p.add_argument("--no-quote", action="store_true",
                   help="the question's turn without its evidence (the sentences of its "
                   "passages that name what it asks about), as before it had any")
    p.add_argument("--no-quote-kv", action="store_true",
                   help="compute the quote's tokens instead of taking them from the passages' KV")
    p.add_argument("--blend-fraction", type=float, default=DEFAULT_BLEND_FRACTION,
                   help="the share of each later passage's tokens recomputed")
    args = p.parse_args()
    rules = args.rules.split(",")
    if unknown := [r for r in rules if r not in RULES]:
        raise SystemExit(f"unknown rule(s) {', '.join(unknown)}: use {', '.join(RULES)}")
    model = model_of(args.model, Path(args.models_dir))
    greedy = GenerationOptions(max_tokens=args.max_tokens, temperature=0)
    cases = [(seed, kind) for seed in map(int, args.seeds.split(","))
             for kind in args.kinds.split(",")]
    rows: list[dict] = []
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    load_before = os.getloadavg()
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        digest = content_hash(model, Path(tmp) / "hashes.json")
        # An engine a size, side by side (the same text is split anew in each store), so
        # each fact is asked at every size in turn: a run cut short still compares them.
        runs = [Size(Path(tmp) / str(n), model, digest, args, target) for n, target in
                enumerate(map(int, (args.targets or "0").split(",")))]
        try:
            ask_all(runs, cases, rules, args, greedy, rows)
        except KeyboardInterrupt:  # (or SIGTERM) a run cut short reports what it asked
            print("stopped: the report covers the questions asked so far", file=sys.stderr)
        sizes = {run.target: run.costs() for run in runs}
        for run in runs:
            run.close()
    report = {"model": str(model), "size": args.size, "n_ctx": args.n_ctx,
              "passage_level": args.passage_level, "blend_fraction": args.blend_fraction,
              "quote": not args.no_quote, "quote_kv": not args.no_quote_kv,
              "kinds": args.kinds, "seeds": args.seeds, "k": args.k or "the app's",
              "runs": []}
    for target in sizes:
        for rule in rules:
            mine = [r for r in rows if r["target"] == target and r["rule"] == rule]
            run = {"target": target, "rule": rule, "facts": len(mine),
                   "passages_mean": round(sum(r["passages"] for r in mine) / max(1, len(mine)),
                                          2),
                   "sources_hit": rate(mine, "source_hit"),
                   "ceiling_states": rate(mine, "ceiling_states"),
                   "states": rate(mine, "states"),
                   "states_where_ceiling_does": rate(mine, "states", "ceiling_states"),
                   "misses_by_cause": causes(mine),
                   "by_passages": {n: rate([r for r in mine if r["passages"] == n], "states",
                                           "ceiling_states")
                                   for n in sorted({r["passages"] for r in mine})}}
            if args.alone:
                run["alone_states"] = rate(mine, "alone_states")
                run["states_where_alone_does"] = rate(mine, "states", "alone_states")
            if args.exact:
                run["exact_states_where_ceiling_does"] = rate(mine, "exact_states",
                                                              "ceiling_states")
            report["runs"].append(run | {"costs": sizes[target]})
    report |= {"seconds": round(time.perf_counter() - t_start, 1),
               "load_average": {"before": load_before, "after": os.getloadavg()}}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
