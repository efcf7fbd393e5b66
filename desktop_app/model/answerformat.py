"""Structured answers: an answer held to JSON or to a JSON schema (what OpenAI's
`response_format` and Ollama's `format` ask for), as the GBNF grammar `llamacalls.chain` puts
first (`AnswerFormat`), with the request field that asked for it, so that a grammar llama.cpp
cannot parse is refused by that field's name.

`json_object`: any JSON object. `json_schema`: a schema's values, through llama-cpp-python's
converter (llama.cpp's json_schema_to_grammar), whose refusal is given in words; a bound that
the converter writes out one repetition at a time (`maxLength`...: `MAX_REPEATS`) is refused
before it is converted: llama.cpp's parser recurses once a repetition, and a bound of ~18,000
overflows the stack of the thread parsing it (a segfault: the whole server gone). A string's
`pattern` describes the decoded string and the grammar writes its JSON text, so the pattern is
rewritten for the converter first (`_json_pattern`): whatever of `"`, `\\` and the control
characters it allows is written only as JSON escapes it, everything else as it is.
`schema_rules` gives several schemas' rules for a grammar whose own root puts them in place (a
tool call's arguments: `desktop_app.tools`).

It only writes grammars: it never parses one nor samples (`llamacalls`). A format is never a
generation option (`GenerationOptions` is also the settings file's and the CLI's: a grammar
there would become a setting); only the local API asks for one.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from llama_cpp import llama_grammar

from ..validation import InvalidValue


@dataclass(frozen=True)
class AnswerFormat:
    """The grammar an answer is held to, and the request field that asked for it."""

    grammar: str
    field: str


def json_object(field: str) -> AnswerFormat:
    """Any JSON object (OpenAI's JSON mode, Ollama's "json"): an object at the top level, as
    both promise, not any JSON value."""
    # llama.cpp's own json.gbnf: its root is an object, and its whitespace bounded (a line
    # break and 20 spaces at most between tokens), so a model cannot fill its answer with
    # blank lines (tests/test_server_structured.py pins both).
    return AnswerFormat(llama_grammar.JSON_GBNF, field)


def json_schema(schema: Any, field: str) -> AnswerFormat:
    """A JSON value that `schema` describes; refused (400, by `field`) where it is not a
    schema or uses what the converter does not support (a remote `$ref`, an unanchored
    `pattern`...), in the converter's words."""
    if not isinstance(schema, dict):
        raise InvalidValue(field, f"a JSON schema is an object (got {_kind(schema)})")
    with _converting(field):
        _bounded(schema, field)
        converter = _Converter.plain()
        converter.visit(converter.resolve_refs(json.loads(json.dumps(schema)), "stdin"), "")
    return AnswerFormat(converter.format_grammar(), field)


def schema_rules(schemas: Sequence[tuple[str, Any, str]]) -> str:
    """GBNF rules for several JSON schemas in one grammar, each (rule name, schema, field)'s
    values under its rule name and no root: for a grammar whose own root puts them in place
    (a tool call's arguments: `desktop_app.tools`). Refused by field as `json_schema`."""
    converter = _Converter.plain()
    for name, schema, field in schemas:
        if not isinstance(schema, dict):
            raise InvalidValue(field, f"a JSON schema is an object (got {_kind(schema)})")
        with _converting(field):
            _bounded(schema, field)
            converter.prefix = name
            # (a copy: the converter writes its own names into the `$ref`s it resolves)
            converter.visit(converter.resolve_refs(json.loads(json.dumps(schema)), field), name)
    return converter.format_grammar()


# A JSON string's character as JSON has it: no control character unescaped. The converter's
# own (`[^"\\]`) lets a raw line break into a string, and the answer is no JSON a client's
# parser takes (llama.cpp's own json.gbnf, `json_object`'s, has this one).
_CHAR = llama_grammar.BuiltinRule(
    r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] '
    r'[0-9a-fA-F])', [])


# A pattern's `.` inside a JSON string: what `.` matches but a line break (the converter's
# `dotall=False`), written as JSON writes it. The converter's own (`[^\x0A\x0D]`) lets a raw
# control character, a raw `"` that ends the string early, and a lone `\\` through.
# `_NOT_IN_STRING`: JSON's exclusions, given to a negated class `_json_pattern` cannot read
# (its characters then matched raw only).
_DOT = r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bft])'
_NOT_IN_STRING = r'"\\\x7F\x00-\x1F'

class _Converter(llama_grammar.SchemaConverter):
    """The converter with JSON's own string characters (`_CHAR`), and each schema's `$ref`
    rules named after its own rule (`prefix`): its own names one by the ref's last part
    alone, so two schemas' `$defs` of one name (pydantic models' `Place`, in two tools) would
    both get the first's rule."""

    prefix = ""

    @classmethod
    def plain(cls) -> _Converter:
        """One as llama-cpp-python's json_schema_to_gbnf makes it: nothing fetched, `.` not
        taking line breaks, patterns as written."""
        return cls(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)

    def _add_primitive(self, name: str, rule: llama_grammar.BuiltinRule) -> str:
        return super()._add_primitive(name, _CHAR if name == "char" else rule)

    def _add_rule(self, name: str, rule: str) -> str:
        return super()._add_rule(name, _DOT if name == "dot" and rule == llama_grammar.DOT
                                 else rule)

    def _visit_pattern(self, pattern: str, name: str) -> str:
        return super()._visit_pattern(_json_pattern(pattern), name)

    def _resolve_ref(self, ref: str) -> str:  # (as the converter's own, but for the name)
        if not self.prefix:  # (one schema: its names as the converter gives them)
            return super()._resolve_ref(ref)
        name = f"{self.prefix}-{ref.split('/')[-1]}"
        if name not in self._rules and ref not in self._refs_being_resolved:
            self._refs_being_resolved.add(ref)
            name = self.visit(self._refs[ref], name)
            self._refs_being_resolved.remove(ref)
        return name


# A pattern describes the decoded string, the grammar its JSON text: the characters JSON
# writes escaped (`"`, `\\`, U+0000-U+001F) are matched there only as json.dumps writes them
# (`_escapes`): a raw `"` ends the string early, and a raw control character is no JSON.
_SPECIAL = [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]
_SHORT = {0x22: '"', 0x5C: "\\\\", 0x08: "b", 0x0C: "f", 0x0A: "n", 0x0D: "r", 0x09: "t"}
_LAST = 0x10FFFF
_CHARS = {"t": 0x09, "n": 0x0A, "r": 0x0D, "f": 0x0C, "v": 0x0B, "0": 0x00}
# As JSON Schema's patterns (ECMA-262) read them: \d and \w ASCII, \s every white space.
_SETS = {"d": [(0x30, 0x39)], "w": [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)],
         "s": [(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
               (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000),
               (0xFEFF, 0xFEFF)]}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}
Ranges = list[tuple[int, int]]


def _json_pattern(pattern: str) -> str:
    """`pattern`, of the decoded string, as a pattern of its JSON text that the converter
    translates as it reads it: a character JSON escapes (`_SPECIAL`), written or in a
    positive class, is matched in its escaped form alone (`_class`); `\\d`, `\\w`, `\\s` and
    an escaped character become the class they stand for (llama.cpp's grammar knows neither
    them nor `\\.`); a negated class is the class of every other character, so written too.
    Read as the converter reads it: a class runs to its first unescaped `]`; an escape this
    does not know (`\\b`, `\\p`) is refused by name, and a class that holds one is left as
    written (a negated one given `_NOT_IN_STRING`). A `]` or `}` that closes nothing is
    refused: the converter would loop on it for good (a server's every route waiting)."""
    out, i, bound = [], 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            value, end = _escape(pattern, i, in_class=False)
            if value is None:  # (llama.cpp's grammar has none: refused there, unnamed)
                raise ValueError(f"the pattern's {pattern[i:end]!r} at {i} is not supported (a "
                                 "word boundary, a Unicode property or a back-reference has no "
                                 "grammar)")
            out.append(_class(_ranges([value])))
        elif c == "[":
            negated, value, end = _read_class(pattern, i)
            out.append(pattern[i:end] if value is None and not negated else
                       f"[^{_NOT_IN_STRING}{pattern[i + 2:end]}" if value is None else
                       _class(_minus([(0, _LAST)], value)) if negated else _class(value))
        elif c == "]" or c == "}" and not bound:
            raise ValueError(f"the pattern's {c!r} at {i} closes nothing (\\{c} is the "
                             "character itself)")
        elif c in "*+?{" and (not out or out[-1] in ("^", "|") or out[-1] == "(" and c != "?"):
            raise ValueError(f"the pattern's {c!r} at {i} repeats nothing (\\{c} is the "
                             "character itself)")  # (the converter fails on it: a 500)
        else:
            bound, end = (bound or c == "{") and c != "}", i + 1
            special = _overlap([(ord(c), ord(c))], _SPECIAL)
            out.append(_class(special) if special else c)
        i = end
    return "".join(out)


def _escape(pattern: str, i: int, *, in_class: bool) -> tuple[int | Ranges | None, int]:
    """The character (or the characters: `\\d`...) the escape at `i` stands for, and where it
    ends; None for one this does not know (two characters long, as the converter reads it)."""
    c = pattern[i + 1:i + 2]
    digits = _HEX_DIGITS.get(c, 0)
    code = pattern[i + 2:i + 2 + digits]
    if digits and len(code) == digits and all(h in "0123456789abcdefABCDEF" for h in code):
        return int(code, 16), i + 2 + digits
    if c.lower() in _SETS:
        return (_SETS[c] if c.islower() else _minus([(0, _LAST)], _SETS[c.lower()])), i + 2
    if c in _CHARS or c == "b" and in_class:  # (`\b`: a backspace in a class, else a boundary)
        return _CHARS.get(c, 0x08), i + 2
    return (ord(c) if c and not c.isalnum() else None), i + 2


def _read_class(pattern: str, i: int) -> tuple[bool, Ranges | None, int]:
    """The class at `i`: whether it is negated, the characters it names (None: it names none,
    or what one escape of it means is not known), and where it ends (the pattern's end where
    it is never closed: the converter refuses it)."""
    negated = pattern.startswith("[^", i)
    j, atoms = i + (2 if negated else 1), []
    while j < len(pattern) and pattern[j] != "]":
        value, end = (_escape(pattern, j, in_class=True) if pattern[j] == "\\"
                      else (ord(pattern[j]), j + 1))
        atoms.append((value, pattern[j] == "-"))  # (an unescaped `-`: a range's, if between)
        j = end
    if j >= len(pattern):
        return negated, None, len(pattern)
    found: list[int | Ranges | None] = []
    k = 0
    while k < len(atoms):
        if k + 2 < len(atoms) and atoms[k + 1][1]:
            low, high = atoms[k][0], atoms[k + 2][0]
            ok = isinstance(low, int) and isinstance(high, int) and low <= high
            found.append([(low, high)] if ok else None)
            k += 3
        else:
            found.append(atoms[k][0])
            k += 1
    return negated, (_ranges(found) if found and None not in found else None), j + 1


def _class(ranges: Ranges) -> str:
    """A pattern of the JSON text of one of `ranges`' characters: those JSON writes as they
    are in a class, the others escaped (`_escapes`), as alternatives."""
    raw, special = _minus(ranges, _SPECIAL), _overlap(ranges, _SPECIAL)
    if not special:
        return f"[{_items(raw)}]"
    return "(" + "|".join(([f"[{_items(raw)}]"] if raw else []) + [_escapes(special)]) + ")"


def _escapes(ranges: Ranges) -> str:
    """A pattern of the escaped forms of `ranges`' characters (all of `_SPECIAL`), as
    json.dumps writes them: `\\"`, `\\\\`, `\\n`... and `\\u00XX`."""
    codes = [c for low, high in ranges for c in range(low, high + 1)]
    short = "".join(_SHORT[c] for c in codes if c in _SHORT)
    found = [f"\\\\[{short}]"] if short else []
    for high in (0, 1):
        lows = "".join(f"{c & 15:x}" for c in codes if c >> 4 == high and c not in _SHORT)
        found += [f"\\\\u00{high}[{lows}]"] if lows else []
    return "|".join(found)


def _items(ranges: Ranges) -> str:
    """A class's inside for `ranges`, each character as llama.cpp's grammar reads it."""
    def one(c: int) -> str:
        return (chr(c) if chr(c).isascii() and chr(c).isalnum() else
                f"\\x{c:02X}" if c < 0x100 else f"\\u{c:04X}" if c < 0x10000 else f"\\U{c:08X}")
    return "".join(one(low) if low == high else f"{one(low)}-{one(high)}"
                   for low, high in ranges)


def _ranges(found: list) -> Ranges:
    """Characters and lists of ranges as sorted ranges that neither overlap nor touch."""
    out: Ranges = []
    for low, high in sorted(r for f in found for r in (f if isinstance(f, list) else [(f, f)])):
        if out and low <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(high, out[-1][1]))
        else:
            out.append((low, high))
    return out


def _minus(ranges: Ranges, cut: Ranges) -> Ranges:
    out: Ranges = []
    for low, high in _ranges([ranges]):
        for cut_low, cut_high in _ranges([cut]):
            if cut_high < low or cut_low > high:
                continue
            if cut_low > low:
                out.append((low, cut_low - 1))
            low = cut_high + 1
        if low <= high:
            out.append((low, high))
    return out


def _overlap(ranges: Ranges, other: Ranges) -> Ranges:
    return _minus(ranges, _minus(ranges, other))


# The most repetitions a schema's bound may ask for. The converter writes `maxLength: n` (and
# `maxItems`, a pattern's `{m,n}`) as n optional groups nested in one another, which
# llama.cpp's grammar parser reads by recursing once a group: measured with an 8 MiB stack
# (Linux's main thread and its default for others), 17,500 parse and 20,000 overflow it; from
# ~1,100 on llama.cpp refuses the grammar anyway ("exceeds sane defaults"). A `minLength` or
# `minItems` is written out flat (it parses at 20,000) but as long, so it is held to the same.
# (The converter ignores `minimum`, `maximum` and the `*Properties` bounds: nothing expands.)
MAX_REPEATS = 1000
_BOUNDS = ("minLength", "maxLength", "minItems", "maxItems")
_QUANTIFIER = re.compile(r"\{(\d*)(?:,(\d*))?\}")
_VALUES = ("enum", "const", "default", "examples")  # (data, not schemas: never walked)


def _bounded(schema: Any, field: str) -> None:
    """Refuse, by the path of the schema that asks for it, a repetition bound above
    `MAX_REPEATS` anywhere in `schema`."""
    if isinstance(schema, list):
        for i, part in enumerate(schema):
            _bounded(part, f"{field}.{i}")
        return
    if not isinstance(schema, dict):
        return
    for key in _BOUNDS:
        n = schema.get(key)
        if isinstance(n, int) and not isinstance(n, bool) and n > MAX_REPEATS:
            raise InvalidValue(field, f"{key} {n} is more than kvdesk's grammar can hold (at "
                               f"most {MAX_REPEATS})")
    pattern = schema.get("pattern")
    if isinstance(pattern, str):
        for m in _QUANTIFIER.finditer(pattern):
            if any(n and int(n) > MAX_REPEATS for n in m.groups()):
                raise InvalidValue(field, f"the pattern's repetition {m.group()} is more than "
                                   f"kvdesk's grammar can hold (at most {MAX_REPEATS})")
    for key, part in schema.items():
        if key not in _VALUES:
            _bounded(part, f"{field}.{key}")


@contextlib.contextmanager
def _converting(field: str) -> Iterator[None]:
    """The schema converter's refusals in words, by `field`."""
    try:
        yield
    except InvalidValue:
        raise  # (already said, by its own field: `_bounded`)
    except (AssertionError, ValueError, KeyError, NotImplementedError) as e:
        raise InvalidValue(field, f"this schema cannot be turned into a grammar: {e}") from None
    except (AttributeError, TypeError):  # (the converter reads every part with .get)
        raise InvalidValue(field, "this schema cannot be turned into a grammar: a part of it "
                           "that should be a schema (an object) is not one") from None
    except RecursionError:
        raise InvalidValue(field, "this schema cannot be turned into a grammar: it is nested "
                           "too deeply") from None


def _kind(value: Any) -> str:
    return {str: "a string", list: "an array", bool: "a boolean", type(None): "null"}.get(
        type(value), "a number")
