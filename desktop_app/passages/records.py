"""Tables and JSON read as records: one line each, every value next to its column or key.

A passage cut from the middle of a CSV file is rows of bare values (`Berlin,2019,17.5`), and
one cut from a JSON file is values under keys whose enclosing objects lie in another passage:
the model cannot tell what they are, and neither can retrieval. So a table (CSV or TSV with a
header row) is read as its column line, then one line per row naming each value's column
(`city: Berlin | year: 2019 | revenue: 17.5`), each line numbered by the file's line the row
starts on, so that sources still cite the file's lines. JSON Lines is read as one record per
object, and a JSON file as one line per object holding plain values, each under its key path
(`servers[2]: host: b.example | tls.cert: b.pem`), each numbered by the file's line its
object (or value) starts on: the `json` module gives no positions, so they are found by a
scan of the file's tokens beside it (`_where`).

A file that is not such a table (a first row that is data: a cell empty, a number or a
sentence, a name twice; rows of every width: prose with commas) or not valid JSON is left to
be read as the text it is (`None`). This module only reads text: it never tokenizes, never
touches the model or the store.
"""

from __future__ import annotations

import bisect
import csv
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass

TABLE_SUFFIXES = {".csv": None, ".tsv": "\t", ".tab": "\t"}
JSON_SUFFIXES = {".json"}
JSON_LINES_SUFFIXES = {".jsonl", ".ndjson"}
RECORDS = ("table", "json")  # the kinds of document read as records, a record a line

_NUMBER = re.compile(r"^[-+]?(?=[.\d]*\d)[\d,_]*\.?\d*([eE][-+]?\d+)?%?$")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class Records:
    text: str  # one record a line, no blank lines
    lines: tuple[int, ...] | None  # the file's line each of text's lines comes from
    kind: str  # the document's: "table" or "json" (RECORDS)


def read(raw: str, suffix: str) -> Records | None:
    """`raw` (a file's decoded text) as records, by its suffix; None when it is not a table
    with a header row, or not JSON."""
    try:
        if suffix in TABLE_SUFFIXES:
            return _table(raw, TABLE_SUFFIXES[suffix])
        if suffix in JSON_LINES_SUFFIXES:
            return _json_lines(raw)
        if suffix in JSON_SUFFIXES:
            return _json(raw)
    except RecursionError:  # JSON nested thousands deep: read as the text it is
        return None
    return None


def _table(raw: str, delimiter: str | None) -> Records | None:
    skipped = 0
    if raw.startswith("sep=") and "\n" in raw:  # Excel's line naming the separator
        skipped, (line, raw) = 1, raw.split("\n", 1)
        delimiter = line[4:5] or delimiter
    if delimiter is None:
        try:
            delimiter = csv.Sniffer().sniff(raw[:65536], delimiters=",;\t|").delimiter
        except csv.Error:
            delimiter = ","
    reader = csv.reader(io.StringIO(raw, newline=""), delimiter=delimiter)
    try:
        header = [_cell(c) for c in next(reader, [])]
        if header[:1] == [""]:  # a data frame's index column, written unnamed
            header[0] = "row"
        if not _is_header(header):
            return None
        out, numbers = [f"Columns: {', '.join(header)}"], [1 + skipped]
        first = reader.line_num + 1 + skipped
        widths = []
        for row in reader:
            widths.append(len(row))
            cells = [(header[i] if i < len(header) else f"column {i + 1}", _cell(c))
                     for i, c in enumerate(row)]
            cells = [(name, value) for name, value in cells if value]
            if cells:
                out.append(" | ".join(f"{name}: {value}" for name, value in cells))
                numbers.append(first)
            first = reader.line_num + 1 + skipped
    except csv.Error:  # a quote left open, a NUL byte: not a table this module can read
        return None
    # Prose that happens to hold commas has rows of every width: no columns to name.
    rows = [w for w in widths if w]
    if len(out) < 2 or sum(w == len(header) for w in rows) < 0.9 * len(rows):
        return None
    return Records("\n".join(out), tuple(numbers), "table")


def _is_header(cells: list[str]) -> bool:
    """Whether a first row names columns: two or more labels, none empty, none a number, none
    a sentence, no two the same (a table without a header starts with its data)."""
    return (len(cells) >= 2 and all(cells) and len(set(cells)) == len(cells)
            and not any(_NUMBER.match(c) or len(c) > 64 for c in cells))


def _cell(value: str) -> str:
    return _SPACE.sub(" ", value).strip()


def _json_lines(raw: str) -> Records | None:
    out: list[str] = []
    numbers: list[int] = []
    for number, line in enumerate(re.split(r"\r\n|\r|\n", raw), 1):  # (JSON's own breaks)
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except ValueError:
            return None
        for record in _lines(value):
            out.append(record)
            numbers.append(number)
    return Records("\n".join(out), tuple(numbers), "json") if out else None


def _json(raw: str) -> Records | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, dict | list):
        return None
    found = [(record.rstrip(), at) for record, at in _flatten(value, "", _where(raw))
             if record.strip()]
    if not found:
        return None
    breaks = [m.end() for m in _BREAK.finditer(raw)]
    numbers = tuple(bisect.bisect_right(breaks, at) + 1 for _, at in found)
    return Records("\n".join(record for record, _ in found), numbers, "json")


def _lines(value) -> list[str]:
    """`value`'s records (`_flatten`), each a line of text: one holding "" says nothing, and
    no blank line is kept (the text's line numbers would no longer be the records')."""
    return [record.rstrip() for record, _ in _flatten(value, "", None) if record.strip()]


# A JSON value's tokens: a string, a structural character, or a bare word (number, true...).
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\],:]|[^\s{}\[\],:"]+')
_BREAK = re.compile(r"\r\n|\r|\n")  # JSON's own line breaks


@dataclass
class _Node:
    """Where a value starts in the file (a character offset), and where its members do:
    a dict of them by key for an object, a list for an array, None for a plain value."""

    at: int
    members: dict | list | None = None


def _where(raw: str) -> _Node | None:
    """The offsets of `raw`'s values, shaped as the value `json.loads(raw)` is (a key given
    twice keeps its last value's, as `json` does). `raw` has parsed as JSON already."""
    stack: list[_Node] = []
    key: list[str | None] = []  # per open object: the key whose value comes next
    root = None
    for m in _TOKEN.finditer(raw):
        token = m.group()
        if token in (",", ":"):
            continue
        if token in ("}", "]"):
            node = stack.pop()
            key.pop()
        elif stack and isinstance(stack[-1].members, dict) and key[-1] is None:
            key[-1] = json.loads(token)  # an object's key
            continue
        else:
            node = _Node(m.start(), {} if token == "{" else [] if token == "[" else None)
            if node.members is not None:
                stack.append(node)
                key.append(None)
                continue
        if not stack:
            root = node
        elif isinstance(stack[-1].members, dict):
            stack[-1].members[key[-1]] = node
            key[-1] = None
        else:
            stack[-1].members.append(node)
    return root


def _member(node: _Node | None, name) -> _Node | None:
    try:
        return node.members[name] if node is not None else None
    except (KeyError, IndexError, TypeError):
        return None


def _flatten(value, path: str, node: _Node | None) -> Iterator[tuple[str, int]]:
    """An object as one line, its nested objects' plain values under dotted keys
    (`user.name: Ada`); the arrays of objects it holds after it, an element a line, each under
    its key path (`orders[0]: item: pen | qty: 2`). Each line with the offset its value starts
    at in the file (`node`'s; 0 where not known)."""
    at = node.at if node is not None else 0
    if isinstance(value, dict):
        plain: list[tuple[str, object]] = []
        nested: list[tuple[str, object, _Node | None]] = []
        _collect(value, "", node, plain, nested)
        if plain:
            body = " | ".join(f"{key}: {_scalar(v)}" for key, v in plain)
            yield (f"{path}: {body}" if path else body), at
        for key, v, member in nested:
            yield from _flatten(v, f"{path}.{key}" if path else key, member)
    elif isinstance(value, list):
        if _plain(value):
            if value:
                yield f"{path or '[]'}: {_scalar(value)}", at
        else:
            for i, v in enumerate(value):
                yield from _flatten(v, f"{path}[{i}]", _member(node, i))
    else:
        yield (f"{path}: {_scalar(value)}" if path else _scalar(value)), at


def _collect(obj: dict, prefix: str, node: _Node | None, plain: list, nested: list) -> None:
    for k, v in obj.items():
        key = prefix + _cell(str(k))
        if isinstance(v, dict):
            _collect(v, key + ".", _member(node, k), plain, nested)
        elif _plain(v):
            plain.append((key, v))
        else:
            nested.append((key, v, _member(node, k)))


def _plain(value) -> bool:
    """A value written on its owner's line: not an object, nor an array holding one or an
    array."""
    return not isinstance(value, dict) and not (
        isinstance(value, list) and any(isinstance(v, dict | list) for v in value))


def _scalar(value) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    if isinstance(value, str):
        return _cell(value)
    return json.dumps(value)
