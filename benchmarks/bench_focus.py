"""Focused retrieval of a planted fact: found, first, and how many passages a chat reads.

A chat retrieves a question's passages `focus`ed (`retrieve.focused`, `most_named`): when
the question has rare words, only the passages holding them are read. Asked as a chat asks
it (focused, `DEFAULT_K`, no recent turns), per planted fact: whether its passage is among
those returned (`found`), whether it is the first (`first`), whether it is the first in the
document's order, as the chat reads them and its window lists them (`read_first`), and how
many are returned (`returned`, summed; `returned_mean`, a question's); beside them BM25's
recall at 1, 3 and 8 unfocused, as `bench_retrieval` counts it.

Kinds: `docs`, `code` and `markdown` are `bench_retrieval`'s haystacks with their planted
facts and questions; `contract` is a lease generated here (nothing is downloaded), whose
clauses write its defined terms capitalised throughout ("the Lessee", "the Premises", "this
Agreement", "the Deposit Account"), with facts planted at depths 0 to 100 % and each asked
twice: naming the defined terms as the contract writes them (`contract`) and in lower
case (`contract-lower`, what the focus gives a question naming no term).

    .venv/bin/python -m benchmarks.bench_focus [--kinds contract,docs,code,markdown]
        [--sizes 300000,1000000] [--seeds 0,1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import tempfile
from pathlib import Path

import llama_cpp

from benchmarks.bench_retrieval import DEPTHS, _cpu, facts, haystack, invented
from desktop_app.model.models import default_model_path
from desktop_app.passages import DEFAULT_K
from desktop_app.passages.embed import WordLlamaEmbedder
from desktop_app.passages.retrieve import Retriever
from store import Store

TERMS = ("Lessor", "Lessee", "Premises", "Agreement", "Rent", "Term", "Building",
         "Guarantor", "Deposit Account", "Landlord's Agent")
ARTICLES = ("DEFINITIONS", "RENT", "USE OF THE PREMISES", "REPAIRS", "INSURANCE",
            "ASSIGNMENT", "DEFAULT", "NOTICES", "GENERAL PROVISIONS")
# Clauses a lease writes again and again, its defined terms in each.
CLAUSES = [
    "The Lessee shall pay the Rent to the Lessor in advance on the {day} day of each month "
    "during the Term, without any deduction or set-off.",
    "The Lessee shall keep the Premises in good and tenantable condition and shall return "
    "them to the Lessor at the end of the Term in the same condition, fair wear excepted.",
    "The Lessor may enter the Premises at reasonable hours on {n} days' written notice to "
    "the Lessee to inspect their condition or to carry out works to the Building.",
    "The Lessee shall not assign, underlet or part with possession of the Premises or any "
    "part of them without the prior written consent of the Lessor under this Agreement.",
    "If the Rent or any part of it remains unpaid for {n} days after its due date, the "
    "Lessor may by notice to the Lessee end this Agreement and re-enter the Premises.",
    "The Guarantor guarantees to the Lessor that the Lessee will pay the Rent and perform "
    "its obligations under this Agreement during the Term.",
    "The Lessee shall use the Premises as offices only and shall comply with the rules of "
    "the Building notified to it by the Landlord's Agent from time to time.",
    "Any amount the Lessee owes under this Agreement may be paid from the Deposit Account "
    "by the Landlord's Agent after {n} days' notice to the Lessee and the Guarantor.",
    "The Lessor shall maintain the structure, roof and common parts of the Building, and "
    "the Lessee shall reimburse a fair share of that cost as part of the Rent.",
    "Each notice under this Agreement shall be in writing and delivered to the address of "
    "the Lessor or the Lessee stated above, or to the Landlord's Agent.",
    "The Lessee shall not make any alteration to the Premises without the consent of the "
    "Lessor, which the Lessor shall not unreasonably withhold under this Agreement.",
    "The Term may be extended by {n} months if the Lessee gives the Lessor notice at least "
    "{m} months before the end of the Term and is not then in breach of this Agreement.",
]
# (fact, question naming defined terms as the contract writes them)
FACTS = [
    ("The security deposit of the Lessee is held by {Name} Trust in account {code}.",
     "Which trust holds the security deposit of the Lessee, and in what account?"),
    ("The Lessee may keep no more than {n} dogs on the Premises at any one time.",
     "How many dogs may the Lessee keep on the Premises?"),
    ("Any dispute arising under this Agreement shall be settled by arbitration in {Place}.",
     "In which city are disputes under the Agreement settled by arbitration?"),
    ("The liability of the Guarantor is capped at {n}000 euros in each year of the Term.",
     "What is the cap on the liability of the Guarantor?"),
    ("A late payment fee of {n} euros is charged to the Lessee for each week the Rent is "
     "overdue.", "What late payment fee does the Lessee pay when the Rent is overdue?"),
    ("The spare keys to the Premises are kept in a {colour} safe in the Building's "
     "basement.", "Where are the spare keys to the Premises kept?"),
    ("Parking bay number {n} in the Building's garage is reserved for the Lessee.",
     "Which parking bay in the garage is reserved for the Lessee?"),
    ("Interest earned on the Deposit Account is paid to the Lessee every {month}.",
     "When is the interest on the Deposit Account paid out?"),
    ("The Landlord's Agent is {Name} Estates, whose office telephone is {code}.",
     "What is the telephone number of the Landlord's Agent's office?"),
    ("The Lessee may install a {colour} awning above the shop front of the Premises.",
     "What colour of awning may the Lessee install on the Premises?"),
    ("Smoking is forbidden everywhere in the Building, including the roof terrace, under "
     "this Agreement.", "Is smoking allowed on the roof terrace of the Building?"),
]
COLOURS = ("green", "grey", "navy", "maroon")
MONTHS = ("January", "April", "July", "October")


def lower_terms(question: str) -> str:
    """`question` with the contract's defined terms in lower case."""
    for term in TERMS:
        question = re.sub(rf"\b{re.escape(term)}", term.lower(), question)
    return question


def contract(size: int, rng: random.Random) -> tuple[str, list[tuple[str, str]]]:
    """A lease of about `size` characters, its clauses under numbered articles, and its
    planted facts with their questions."""
    planted = []
    for fact, question in FACTS:
        values = {"Name": invented(rng), "Place": invented(rng), "n": rng.randint(2, 90),
                  "code": f"{rng.randint(10, 99)}-{rng.randint(100, 999)}-XQ",
                  "colour": rng.choice(COLOURS), "month": rng.choice(MONTHS)}
        planted.append((fact.format(**values), question))
    paragraphs, chars, article = [], 0, 0
    while chars < size:
        if not paragraphs or rng.random() < 0.08:
            article += 1
            paragraphs.append(f"ARTICLE {article}. {ARTICLES[article % len(ARTICLES)]}")
        clause = rng.choice(CLAUSES).format(day=rng.choice(("first", "fifth", "tenth")),
                                            n=rng.randint(2, 60), m=rng.randint(2, 12))
        paragraphs.append(f"{article}.{len(paragraphs)} {clause}")
        chars += len(paragraphs[-1]) + 2
    for (fact, _), depth in sorted(zip(planted, DEPTHS, strict=True), key=lambda x: -x[1]):
        at = max(1, round(depth * len(paragraphs)))
        paragraphs.insert(at, f"{article}.{at}a {fact}")
    return "\n\n".join(paragraphs), planted


def asked(kind: str, size: int, seed: int) -> tuple[str, list[tuple[str, str, str]]] | None:
    """(haystack, [(row, fact, question)]), None where the kind's text is shorter."""
    rng = random.Random(f"{seed}-{kind}-{size}")
    if kind == "contract":
        text, planted = contract(size, rng)
        return text, [(row, fact, q) for fact, question in planted
                      for row, q in (("contract", question),
                                     ("contract-lower", lower_terms(question)))]
    planted = facts(rng)
    text = haystack(kind, size, planted)
    return None if text is None else (text, [(kind, f, q) for f, q in planted])


def run(kind: str, size: int, seed: int, llm, embedder) -> dict | None:
    made = asked(kind, size, seed)
    if made is None:
        return None
    text, questions = made
    count = lambda s: len(llm.tokenize(s.encode("utf-8"), add_bos=False, special=True))  # noqa: E731
    split_as = {"code": "code", "contract": "text"}.get(kind, "markdown")
    rows: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp, Store(Path(tmp)) as store:
        doc = store.add_document(f"{kind}-{size}", kind, text, type=split_as)
        retriever = Retriever(store, embedder, "bm25")
        passages = retriever.index.add(doc.id, text, split_as, count)
        for row_name, fact, question in questions:
            row = rows.setdefault(row_name, {"n": 0, "found": 0, "first": 0, "read_first": 0,
                                             "returned": 0, "@1": 0, "@3": 0, "@8": 0})
            hits = retriever.retrieve(doc.id, question, k=DEFAULT_K, focus=True)
            ranked = retriever.retrieve(doc.id, question, k=8)
            rank = next((i for i, h in enumerate(ranked) if fact in h.text), 99)
            row["n"] += 1
            row["found"] += any(fact in h.text for h in hits)
            row["first"] += bool(hits) and fact in hits[0].text
            read = sorted(hits, key=lambda h: h.index)
            row["read_first"] += bool(read) and fact in read[0].text
            row["returned"] += len(hits)
            for k in (1, 3, 8):
                row[f"@{k}"] += rank < k
    return {"kind": kind, "size": size, "seed": seed, "passages": passages, "rows": rows}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kinds", default="contract,docs,code,markdown")
    ap.add_argument("--sizes", default="300000,1000000")
    ap.add_argument("--seeds", default="0,1")
    args = ap.parse_args(argv)
    load_before = os.getloadavg()
    llm = llama_cpp.Llama(str(default_model_path()), vocab_only=True, verbose=False)
    embedder = WordLlamaEmbedder()
    results, totals = [], {}
    for kind in args.kinds.split(","):
        for size in map(int, args.sizes.split(",")):
            for seed in map(int, args.seeds.split(",")):
                if (r := run(kind, size, seed, llm, embedder)) is None:
                    continue
                results.append(r)
                for name, row in r["rows"].items():
                    total = totals.setdefault(name, dict.fromkeys(row, 0))
                    for key, value in row.items():
                        total[key] += value
    for total in totals.values():
        total["returned_mean"] = round(total["returned"] / total["n"], 2)
    print(json.dumps({"cpu": _cpu(), "load_average": {"before": load_before,
                                                      "after": os.getloadavg()},
                      "results": results, "totals": totals}, indent=1))


if __name__ == "__main__":
    main()
