"""Passages of long documents: their text and locations, a full-text index, and their vectors.

A document too long for a model's context is kept as passages (rows of `passages`, in
document order), indexed by SQLite's FTS5 (`passages_fts`, an external-content index kept in
step by triggers, ranked by BM25; it reads each CJK character as a word, `store.words`, and a
question's CJK runs are searched as their pairs) and by dense vectors (`passage_vectors`: one
float32 row per passage and embedding model, L2-normalised by whoever made them; compared
with numpy). Text, index and vectors are the document's: they are never evicted (they are
not KV and the storage budget does not count them), and deleting the document deletes them.

Each passage has a `content_hash` (SHA-256 of its text): the key its KV is stored under, so
the same text is one cache whichever document holds it. This module never touches KV entries
or chunks, and never embeds or splits anything: it stores what it is given.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..datadir.db import Connections, execute_script
from ..datadir.values import stored_json
from ..errors import NotFoundError
from ..words import FTS_HEADINGS, FTS_TEXT, cjk_words, index_text

M008_PASSAGES = """
CREATE TABLE passages (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    document_id INTEGER NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,               -- its order in the document, from 0
    text TEXT NOT NULL,
    char_start INTEGER NOT NULL,        -- [char_start, char_end) of the document's text
    char_end INTEGER NOT NULL,
    page INTEGER,                       -- a PDF's page (1-based), else NULL
    line_start INTEGER NOT NULL,        -- first and last line (1-based)
    line_end INTEGER NOT NULL,
    heading TEXT NOT NULL,              -- JSON list: the headings it sits under
    n_tokens INTEGER NOT NULL,          -- under the tokenizer it was split with
    content_hash TEXT NOT NULL,         -- SHA-256 (hex) of text: the key of its KV
    UNIQUE (document_id, idx)
);
CREATE INDEX passages_content ON passages(content_hash);
CREATE VIRTUAL TABLE passages_fts USING fts5(
    text, heading, content='passages', content_rowid='id', tokenize='porter unicode61'
);
CREATE TRIGGER passages_fts_insert AFTER INSERT ON passages BEGIN
    INSERT INTO passages_fts(rowid, text, heading) VALUES (new.id, new.text, new.heading);
END;
CREATE TRIGGER passages_fts_delete AFTER DELETE ON passages BEGIN
    INSERT INTO passages_fts(passages_fts, rowid, text, heading)
        VALUES ('delete', old.id, old.text, old.heading);
END;
CREATE TABLE passage_vectors (
    passage_id INTEGER NOT NULL REFERENCES passages(id) ON DELETE CASCADE,
    embedder TEXT NOT NULL,             -- the embedding model's name
    vector BLOB NOT NULL,               -- float32 little-endian
    PRIMARY KEY (passage_id, embedder)  -- a rowid table: WITHOUT ROWID would give each ~1 kB
)                                       -- row a page of its own (4x the bytes, measured)
"""


def m008_passages(conn: sqlite3.Connection) -> None:
    """Passages of documents too long for the context: text, locations, FTS5 index, vectors."""
    execute_script(conn, M008_PASSAGES)


# The index made anew, reading each passage as `store.words` gives it (CJK characters as words
# of their own) through a view: its content is what it indexed, so FTS5's checks of the index
# against its content (integrity-check, rebuild) read the same text the triggers gave it.
M014_CJK_INDEX = f"""
DROP TRIGGER passages_fts_insert;
DROP TRIGGER passages_fts_delete;
DROP TABLE passages_fts;
CREATE VIEW passages_fts_source AS
    SELECT id, {FTS_TEXT}(text) AS text, {FTS_HEADINGS}(heading) AS heading
    FROM passages;
CREATE VIRTUAL TABLE passages_fts USING fts5(
    text, heading, content='passages_fts_source', content_rowid='id', tokenize='porter unicode61'
);
CREATE TRIGGER passages_fts_insert AFTER INSERT ON passages BEGIN
    INSERT INTO passages_fts(rowid, text, heading)
        VALUES (new.id, {FTS_TEXT}(new.text), {FTS_HEADINGS}(new.heading));
END;
CREATE TRIGGER passages_fts_delete AFTER DELETE ON passages BEGIN
    INSERT INTO passages_fts(passages_fts, rowid, text, heading)
        VALUES ('delete', old.id, {FTS_TEXT}(old.text), {FTS_HEADINGS}(old.heading));
END;
INSERT INTO passages_fts(passages_fts) VALUES ('rebuild');
"""


def m014_cjk_index(conn: sqlite3.Connection) -> None:
    """The passages' full-text index reading Chinese, Japanese and Korean character by
    character (`store.words`), every passage indexed again."""
    execute_script(conn, M014_CJK_INDEX)


@dataclass(frozen=True)
class StoredPassage:
    id: int
    document_id: int
    index: int
    text: str
    start: int
    end: int
    page: int | None
    lines: tuple[int, int]
    heading: tuple[str, ...]
    tokens: int
    content_hash: str


COLUMNS = ("id, document_id, idx, text, char_start, char_end, page, line_start, line_end,"
           " heading, n_tokens, content_hash")


def _record(conn: sqlite3.Connection, row: Sequence) -> StoredPassage:
    (pid, doc, idx, text, start, end, page, first, last, heading, tokens, digest) = row
    return StoredPassage(pid, doc, idx, text, start, end, page, (first, last), tuple(
        stored_json(conn, heading, f"the heading of passage {pid}")), tokens, digest)


# Words too common to tell passages apart; BM25 would weigh them near zero anyway, but each
# one more OR term makes FTS5 walk its long posting list.
_STOPWORDS = frozenset(
    "a an and are as at be by did do does for from had has have how i in is it its of on or "
    "that the this to was were what when where which who whom why will with you your".split())


def text_hash(text: str) -> str:
    """A passage's `content_hash`: the name of its text, and of its KV entries'."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def query_words(query: str) -> list[str]:
    """The words of a query worth searching for, each once, in order (at most 64); a run of
    Chinese, Japanese or Korean characters as its overlapping pairs (`store.words`)."""
    words = [part for w in re.findall(r"\w+", query.lower()) for part in cjk_words(w)
             if part not in _STOPWORDS]
    return list(dict.fromkeys(words))[:64]


def phrase(word: str) -> str:
    """`word` (of `query_words`, or a name of several) as an FTS5 phrase, quoted: no FTS5
    syntax of the user's can break it; a CJK pair as the two tokens the index holds."""
    return '"' + " ".join(index_text(word).split()).replace('"', '""') + '"'


def match_expression(query: str) -> str | None:
    """An FTS5 query matching any of the query's words (`phrase`), or None for a query with
    no word worth searching for."""
    return " OR ".join(map(phrase, query_words(query))) or None


class PassageStore:
    """The Store's passages (a base class of `store.Store`, which owns `_db`)."""

    _db: Connections

    def _reclaim(self) -> None: ...

    def add_passages(self, document_id: int, passages: Sequence[Any], *,
                     vectors: np.ndarray | None = None, embedder: str | None = None
                     ) -> list[int]:
        """Store a document's passages (replacing any it had) and, given, their vectors made
        by `embedder` (one row per passage, float32); returns the new ids in order. A passage
        is anything with StoredPassage's attributes less id, document_id and content_hash
        (desktop_app.passages.split.Passage)."""
        if (vectors is None) != (embedder is None):
            raise ValueError("passage vectors need the name of the model that made them")
        if vectors is not None and len(vectors) != len(passages):
            raise ValueError(f"{len(vectors)} vectors for {len(passages)} passages")
        rows = [(document_id, p.index, p.text, p.start, p.end, p.page, p.lines[0], p.lines[1],
                 json.dumps(list(p.heading)), p.tokens, text_hash(p.text)) for p in passages]
        with self._db.write() as db:
            if not db.execute("SELECT 1 FROM documents WHERE id = ?", (document_id,)).fetchone():
                raise NotFoundError(f"no document {document_id}")
            db.execute("DELETE FROM passages WHERE document_id = ?", (document_id,))
            ids = [db.execute(
                "INSERT INTO passages (document_id, idx, text, char_start, char_end, page,"
                " line_start, line_end, heading, n_tokens, content_hash)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row).lastrowid for row in rows]
            if vectors is not None:
                _put_vectors(db.conn, ids, embedder, vectors)
        self._db.reclaim()
        return ids

    def set_passage_vectors(self, passage_ids: Sequence[int], embedder: str,
                            vectors: np.ndarray) -> None:
        """Store (or replace) the vectors `embedder` made for these passages."""
        if len(vectors) != len(passage_ids):
            raise ValueError(f"{len(vectors)} vectors for {len(passage_ids)} passages")
        with self._db.write() as db:
            _put_vectors(db.conn, list(passage_ids), embedder, vectors)

    def set_passage_lines(self, lines: Sequence[tuple[int, tuple[int, int]]]) -> None:
        """(passage id, (first, last line)) for passages whose lines were numbered otherwise."""
        with self._db.write() as db:
            db.conn.executemany("UPDATE passages SET line_start = ?, line_end = ? WHERE id = ?",
                                [(a, b, pid) for pid, (a, b) in lines])

    def passages(self, document_id: int, first: int = 0,
                 last: int | None = None) -> list[StoredPassage]:
        """A document's passages in document order (none: it fits the context, or is new),
        those from its `first`-th to its `last`-th when given."""
        conn = self._db.get().conn
        rows = conn.execute(
            f"SELECT {COLUMNS} FROM passages WHERE document_id = ? AND idx >= ? AND idx <= ? "
            "ORDER BY idx", (document_id, first, (1 << 62) if last is None else last))
        return [_record(conn, row) for row in rows]

    def passage_counts(self) -> dict[int, int]:
        """{document id: passages} of the documents kept as passages."""
        return dict(self._db.get().execute(
            "SELECT document_id, count(*) FROM passages GROUP BY document_id").fetchall())

    def passage(self, passage_id: int) -> StoredPassage:
        conn = self._db.get().conn
        row = conn.execute(f"SELECT {COLUMNS} FROM passages WHERE id = ?",
                           (passage_id,)).fetchone()
        if row is None:
            raise NotFoundError(f"no passage {passage_id}")
        return _record(conn, row)

    def search_passages(self, document_id: int, query: str,
                        k: int = 10) -> list[tuple[StoredPassage, float]]:
        """The `k` passages of a document that best match `query` by BM25, best first, with
        their scores (higher is better). Any text is a valid query: it is searched word by
        word, never parsed as FTS5 syntax."""
        expression = match_expression(query)
        if expression is None or k <= 0:
            return []
        cols = ", ".join(f"p.{c.strip()}" for c in COLUMNS.split(","))
        conn = self._db.get().conn
        rows = conn.execute(
            f"SELECT {cols}, bm25(passages_fts, 1.0, 0.5) AS rank FROM passages_fts"
            " JOIN passages p ON p.id = passages_fts.rowid"
            " WHERE passages_fts MATCH ? AND p.document_id = ? ORDER BY rank LIMIT ?",
            (expression, document_id, k)).fetchall()
        # FTS5's bm25() is negative, more negative for better matches.
        return [(_record(conn, row[:-1]), -row[-1]) for row in rows]

    def passage_frequencies(self, document_id: int, query: str,
                            at_most: int) -> dict[str, int]:
        """{word: how many of the document's passages hold it, counted up to `at_most`} for
        each word of `query` searched for (as `passages_holding` finds it). Counting stops
        there: a common word's thousands of passages are never walked."""
        return {word: len(self.passages_holding(document_id, word, at_most))
                for word in query_words(query)}

    def passages_holding(self, document_id: int, word: str, at_most: int) -> list[int]:
        """The ids of at most `at_most` of the document's passages holding `word`, as the index
        reads it (stemmed, case folded), or, for an identifier written with an underscore, as
        it is written (case folded): the index splits it at its underscores, so `__missing__`
        would be any passage saying "missing"."""
        literal = "_" in word
        return [pid for (pid,) in self._db.get().execute(
            # CROSS JOIN: the index is walked first (and stops at the limit), never once per
            # passage of the document, which is the plan SQLite picks for a plain JOIN.
            "SELECT p.id FROM passages_fts CROSS JOIN passages p ON p.id = passages_fts.rowid"
            " WHERE passages_fts MATCH ? AND p.document_id = ?"
            + (" AND instr(lower(p.text || ' ' || p.heading), ?) > 0" if literal else "")
            + " LIMIT ?",
            (phrase(word), document_id,
             *([word.lower()] if literal else []), at_most))]

    def passage_vectors(self, document_id: int,
                        embedder: str) -> tuple[list[int], np.ndarray | None]:
        """(passage ids in document order, their vectors [n, d]) by `embedder`; (ids, None)
        when any passage of the document lacks one."""
        rows = self._db.get().execute(
            "SELECT p.id, v.vector FROM passages p LEFT JOIN passage_vectors v"
            " ON v.passage_id = p.id AND v.embedder = ? WHERE p.document_id = ? ORDER BY p.idx",
            (embedder, document_id)).fetchall()
        ids = [pid for pid, _ in rows]
        if not rows or any(blob is None for _, blob in rows):
            return ids, None
        matrix = np.frombuffer(b"".join(blob for _, blob in rows), dtype="<f4")
        return ids, matrix.reshape(len(rows), -1)


def _put_vectors(conn: sqlite3.Connection, ids: Sequence[int], embedder: str,
                 vectors: np.ndarray) -> None:
    data = np.ascontiguousarray(vectors, dtype="<f4")
    if data.ndim != 2:
        raise ValueError(f"passage vectors must be a [n, d] matrix, not {data.shape}")
    conn.executemany("INSERT OR REPLACE INTO passage_vectors VALUES (?, ?, ?)",
                     [(pid, embedder, row.tobytes()) for pid, row in zip(ids, data, strict=True)])

