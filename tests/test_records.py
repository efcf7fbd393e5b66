"""Tables and JSON read as records: every passage says what its values are, and cites the
file's lines."""

from __future__ import annotations

import json
import random

import pytest

from desktop_app.chat.documents import _normalize, extract
from desktop_app.passages.embed import WordLlamaEmbedder
from desktop_app.passages.evidence import naming
from desktop_app.passages.records import read
from desktop_app.passages.retrieve import RARE_PASSAGES, Retriever, name_phrases
from desktop_app.passages.split import split
from store import Store


def words(text: str) -> int:
    return len(text.split())


def test_a_table_is_read_as_its_columns_then_a_row_a_line(tmp_path):
    path = tmp_path / "sales.csv"
    # A quoted cell holding a newline and a comma, an empty cell, a blank row, CRLF endings.
    path.write_bytes(b'city,year,revenue\r\nBerlin,2019,17.5\r\n"Paris,\r\nFR",2020,\r\n\r\n'
                     b"Oslo,2021,9\r\n")
    doc = extract(path)
    assert doc.kind == "table"
    assert doc.text.split("\n") == [
        "Columns: city, year, revenue", "city: Berlin | year: 2019 | revenue: 17.5",
        "city: Paris, FR | year: 2020", "city: Oslo | year: 2021 | revenue: 9"]
    assert doc.lines == (1, 2, 3, 6)  # the file's line each row starts on
    assert _normalize(doc.text) == doc.text


def test_a_data_frames_index_column_and_excels_separator_line_are_read(tmp_path):
    (tmp_path / "df.csv").write_text(",name,age\n0,Ada,36\n1,Bo,4\n")
    assert extract(tmp_path / "df.csv").text.split("\n")[1] == "row: 0 | name: Ada | age: 36"
    (tmp_path / "x.csv").write_text("sep=;\nname;age\nAda;36\n")
    doc = extract(tmp_path / "x.csv")
    assert doc.text == "Columns: name, age\nname: Ada | age: 36" and doc.lines == (2, 3)


@pytest.mark.parametrize("name, body, sep", [
    ("t.tsv", "name\tage\nAda\t36\n", "\t"), ("t.csv", "name;age\nAda;36\n", ";"),
    ("t.csv", "name|age\nAda|36\n", "|")])
def test_the_tables_separator_is_its_suffixs_or_found(tmp_path, name, body, sep):
    (tmp_path / name).write_text(body)
    assert extract(tmp_path / name).text == "Columns: name, age\nname: Ada | age: 36"


@pytest.mark.parametrize("body", [
    "1,2,3\n4,5,6\n",  # no header row: numbers
    "Berlin,2019,17.5\nMunich,2020,12.0\n",  # no header row: its first row is data
    "name,,age\nAda,1,36\n",  # a header cell empty
    "name,name\nAda,Bo\n",  # the same column twice
    "just one column\nof text\n",
    "a,b\n",  # a header and no row
    "Dear team, I hope you are well\nRegards, Ada\nMore words, and more, and more\n",
])
def test_a_csv_that_is_no_table_with_a_header_stays_text(tmp_path, body):
    (tmp_path / "t.csv").write_text(body)
    doc = extract(tmp_path / "t.csv")
    assert doc.kind == "text" and doc.text == body.strip("\n")


def test_json_lines_are_a_record_each_nested_values_under_dotted_keys(tmp_path):
    rows = [{"id": 5, "user": {"name": "Ada", "tags": ["x", "y"]},
             "orders": [{"item": "pen", "qty": 2}, {"item": "ink"}]},
            {"id": 6, "note": "two\nlines", "ok": True, "none": None}]
    path = tmp_path / "log.jsonl"
    path.write_text(json.dumps(rows[0]) + "\n\n" + json.dumps(rows[1]) + "\n")
    doc = extract(path)
    assert doc.kind == "json"
    assert doc.text.split("\n") == [
        "id: 5 | user.name: Ada | user.tags: [x, y]", "orders[0]: item: pen | qty: 2",
        "orders[1]: item: ink", "id: 6 | note: two lines | ok: true | none: null"]
    assert doc.lines == (1, 1, 1, 3)


def test_json_records_saying_nothing_leave_no_blank_line(tmp_path):
    # "" flattens to nothing: a blank line would be collapsed and the lines misnumbered.
    path = tmp_path / "e.jsonl"
    path.write_text('""\n"  "\n{"a": 1, "b": ""}\n{"c": "x\u2028y"}\n')
    doc = extract(path)
    assert doc.text == "a: 1 | b:\nc: x y" and doc.lines == (3, 4)
    assert _normalize(doc.text) == doc.text


def test_a_json_file_names_every_value_by_its_key_path(tmp_path):
    config = {"version": 3, "servers": [{"host": "a.example", "tls": {"cert": "a.pem"}},
                                        {"host": "b.example", "ports": [80, 443]}],
              "matrix": [[1, 2], [3]]}
    (tmp_path / "c.json").write_text(json.dumps(config, indent=2))
    doc = extract(tmp_path / "c.json")
    assert doc.kind == "json"
    # Each record cites the file's line its object (or array) starts on.
    assert doc.lines == (1, 4, 10, 19, 23)
    assert doc.text.split("\n") == [
        "version: 3", "servers[0]: host: a.example | tls.cert: a.pem",
        "servers[1]: host: b.example | ports: [80, 443]", "matrix[0]: [1, 2]",
        "matrix[1]: [3]"]
    assert read("[1, 2]", ".json").text == "[]: [1, 2]"


@pytest.mark.parametrize("name, body", [("bad.json", '{"a": '), ("bad.jsonl", '{"a": 1}\n{'),
                                        ("s.json", '"just a string"'),
                                        ("deep.json", "[" * 5000 + "]" * 5000)])
def test_what_is_not_json_records_is_read_as_its_text(tmp_path, name, body):
    (tmp_path / name).write_text(body)
    doc = extract(tmp_path / name)
    assert doc.kind in ("code", "text") and doc.text == body


def test_a_json_files_passages_cite_the_files_lines_not_the_records(tmp_path):
    """A pretty-printed `{"servers": [...]}`: a server's passage cites the lines its object
    is on in the file (thousands of lines after its record's number)."""
    servers = [{"host": f"h{i}.internal", "port": 1000 + i, "tls": {"cert": f"c{i}.pem"},
                "tags": ["a", "b"]} for i in range(600)]
    servers[400]["host"] = "glowworm.internal"
    path = tmp_path / "servers.json"
    path.write_text(json.dumps({"servers": servers}, indent=2, sort_keys=False))
    file_lines = path.read_text().split("\n")
    doc = extract(path)
    passages = split(doc.text, doc.kind, words, line_numbers=doc.lines, target=60, limit=120)
    found = next(p for p in passages if "glowworm" in p.text)
    first, last = found.lines
    assert any("glowworm.internal" in line for line in file_lines[first - 1:last + 12])
    for p in passages:
        first, last = p.lines
        # Each passage's first and last records are the objects opening at its first and
        # last lines: servers[i] is `{` at the file's line 3 + 11 i.
        records = p.text.split("\n")
        number = int(records[0].split("]")[0].removeprefix("servers["))
        assert first == 3 + 11 * number and file_lines[first - 1].strip() == "{"
        number = int(records[-1].split("]")[0].removeprefix("servers["))
        assert last == 3 + 11 * number
    # Minified, a file of one line cites line 1.
    path.write_text(json.dumps({"servers": servers}))
    assert set(extract(path).lines) == {1}


def test_a_passage_cut_from_a_tables_middle_names_its_columns_and_the_files_lines(tmp_path):
    header = "employee,department,city,salary"
    rows = [f"Person {i},Dept {i % 7},City {i % 13},{30000 + 17 * i}" for i in range(400)]
    path = tmp_path / "staff.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    doc = extract(path)
    passages = split(doc.text, doc.kind, words, line_numbers=doc.lines, target=60, limit=120)
    assert len(passages) > 20
    file_lines = path.read_text().split("\n")
    for p in passages[1:]:
        assert all(line.startswith("employee: Person ") and "| salary: " in line
                   for line in p.text.split("\n"))
        first, last = p.lines
        # The passage's rows are the file's rows of the lines it cites.
        cited = [line.split(",")[0] for line in file_lines[first - 1:last]]
        assert cited == [line.split(" | ")[0].removeprefix("employee: ")
                         for line in p.text.split("\n")]


def test_names_of_several_capitalised_words_are_read_whole():
    assert name_phrases("What is the extension of Ines Brandt?") == ["ines brandt"]
    assert name_phrases("What is Ines Brandt's extension?") == ["ines brandt"]
    assert name_phrases("Is Ines Brandt in Oslo?") == ["ines brandt"]  # not "Is"
    assert name_phrases("Does Zoë Ärnström work? And Ines Brandt?") == ["zoë ärnström",
                                                                        "ines brandt"]
    assert "ines brandt" in name_phrases("When Did Ines Brandt Join?")  # title case
    assert name_phrases("Who runs the New York Stock Exchange?")[:2] == [
        "new york stock exchange", "new york stock"]  # the longest first
    assert name_phrases("What is the stock of SKU S12-1?") == ["sku s12 1"]  # as indexed
    assert name_phrases("What is the Zelmar vault?") == []
    assert name_phrases("WHAT IS THE EXTENSION OF INES BRANDT") == []  # a sentence


@pytest.fixture(scope="module")
def embedder():
    return WordLlamaEmbedder()


def test_a_name_of_common_words_finds_its_row_alone_and_quotes_that_line(tmp_path, embedder):
    """A staff table's first and last names are each in many passages; the person's name is
    in one. Retrieval reads that passage alone, and the turn quotes the row, not the rows
    around it."""
    first = ["Ines", "Ivan", "Mara", "Jonas", "Lena", "Ravi", "Sofia", "Emil", "Zoe", "Hana"]
    last = ["Brandt", "Okafor", "Tanaka", "Novak", "Haddad", "Weber", "Costa", "Berg", "Quinn"]
    people = [f"{f} {s}" for s in last for f in first]
    random.Random(1).shuffle(people)
    rows = [f"{name},{1000 + 7 * i},Office {i % 5}" for i, name in enumerate(people)]
    (tmp_path / "staff.csv").write_text("employee,extension,office\n" + "\n".join(rows))
    doc = extract(tmp_path / "staff.csv")
    store = Store(tmp_path / "data")
    stored = store.add_document("h", "staff", doc.text, type=doc.kind)
    retriever = Retriever(store, embedder)
    retriever.index.add(stored.id, doc.text, doc.kind, words)
    assert len(store.passages_holding(stored.id, "ines", 10)) > RARE_PASSAGES
    question = "What is the extension of Ines Brandt?"
    hits = retriever.retrieve(stored.id, question, focus=True)
    assert [h.text.count("employee: Ines Brandt |") for h in hits] == [1]
    row = next(r for r in doc.text.split("\n") if r.startswith("employee: Ines Brandt |"))
    assert naming(store, stored.id, question, [h.text for h in hits], kind=doc.kind) == [row]
    store.close()
