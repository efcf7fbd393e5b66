"""Whether a long table is answered better read as records than as its bare rows.

    .venv/bin/python -m benchmarks.bench_tables [--model default|gemma|PATH] [--rows 500]
        [--questions 20] [--seed 0] [--n-ctx 4096] [--uncalibrated | --calibration CAL.kvcl]

A staff table of invented people (employee, department, office, extension, start year,
salary; `--rows` rows, far longer than the context) is attached twice, as a user's two
files: `staff.csv`, which kvdesk reads as records (`passages.records`: each value next to its
column), and `staff.txt`, the same bytes read as text (bare comma-separated rows, as every
CSV was read before). Each of `--questions` questions asks one value of one person ("What
is the extension of Mara Lindqvist?"), in a new chat over each file, at temperature 0. Per
question and file: whether the person's row is in a passage among the answer's sources, and
whether the answer states the value. Prints a JSON line per question, then the rates.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
from pathlib import Path

from benchmarks.common import add_calibration_flags, model_of, use_calibration
from desktop_app.engine import Engine
from desktop_app.model.models import content_hash
from desktop_app.model.runtime import Runtime
from desktop_app.options import GenerationOptions
from store import Store

FIRST = ("Mara", "Tobias", "Ines", "Kwame", "Yuki", "Lena", "Ravi", "Sofia", "Emil", "Nadia",
         "Oskar", "Priya", "Jonas", "Amara", "Felix", "Hana", "Mateo", "Zoe", "Ivan", "Leila")
LAST = ("Lindqvist", "Okafor", "Brandt", "Moreau", "Tanaka", "Novak", "Castillo", "Haddad",
        "Kowalski", "Fischer", "Duarte", "Ishikawa", "Petrov", "Sorensen", "Mbeki", "Varga",
        "Quinn", "Rahman", "Albers", "Ferreira", "Nakamura", "Ortiz", "Weber", "Costa", "Berg")
DEPARTMENTS = ("Finance", "Logistics", "Research", "Legal", "Support", "Marketing", "Security")
OFFICES = ("Oslo", "Porto", "Nairobi", "Osaka", "Lyon", "Tallinn", "Quito", "Perth", "Ghent")
ASKED = {"extension": "What is the phone extension of {}?",
         "office": "In which office does {} work?",
         "salary": "What is the salary of {}?",
         "start_year": "In which year did {} start?"}


def table(rows: int, rng: random.Random) -> tuple[str, list[dict]]:
    names = rng.sample([f"{f} {s}" for f in FIRST for s in LAST], rows)  # (at most 500)
    people = [{"employee": name, "department": rng.choice(DEPARTMENTS),
               "office": rng.choice(OFFICES), "extension": str(rng.randint(1000, 9999)),
               "start_year": str(rng.randint(1995, 2024)),
               "salary": str(rng.randint(300, 1500) * 100)} for name in names]
    columns = list(people[0])
    lines = [",".join(columns)] + [",".join(p[c] for c in columns) for p in people]
    return "\n".join(lines) + "\n", people


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--rows", type=int, default=500)
    p.add_argument("--questions", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-ctx", type=int, default=4096)
    add_calibration_flags(p)
    args = p.parse_args()
    rng = random.Random(args.seed)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        model = model_of(args.model, Path.home() / ".cache" / "kvdesk" / "bench-models")
        digest = content_hash(model, folder / "hashes.json")
        store = Store(folder / "data")
        eng = Engine(store, lambda: Runtime(model, model_hash=digest, n_ctx=args.n_ctx),
                     fill_passages=False)
        body, people = table(args.rows, rng)
        docs = {}
        for name in ("staff.csv", "staff.txt"):
            (folder / name).write_text(body)
            docs[name] = eng.attach(folder / name).doc_id
        levels = use_calibration(eng, args)
        greedy = GenerationOptions(temperature=0.0, max_tokens=32)
        tally = {name: {"sources_hit": 0, "states": 0} for name in docs}
        for person in rng.sample(people, args.questions):
            field = rng.choice(list(ASKED))
            question = ASKED[field].format(person["employee"])
            row = {"question": question, "expected": person[field]}
            for name, doc_id in docs.items():
                result = eng.ask(question, doc_ids=[doc_id], generation=greedy)
                hit = any(person["employee"] + "," in s["text"] or
                          f"employee: {person['employee']} |" in s["text"]
                          for s in result.sources)
                states = person[field] in result.answer.replace(",", "")
                tally[name]["sources_hit"] += hit
                tally[name]["states"] += states
                row[name] = {"answer": result.answer.strip(), "sources_hit": hit,
                             "states": states}
            print(json.dumps(row), flush=True)
        passages = {name: len(store.passages(doc_id)) for name, doc_id in docs.items()}
        eng.close()
        store.close()
    print(json.dumps({
        "model": str(model), "rows": args.rows, "questions": args.questions,
        "seed": args.seed, "levels": levels, "passages": passages,
        "rates": {name: {k: f"{v} of {args.questions}" for k, v in t.items()}
                  for name, t in tally.items()},
        "load_average": {"before": load_before, "after": os.getloadavg()},
    }, indent=2))


if __name__ == "__main__":
    main()
