"""How the shared room names what it moved: an entry by its document's title (a passage's as
an answer's sources cite it), an evicted cache by its document's. Only reads the local store:
it never talks to the tier nor writes anything.
"""

from __future__ import annotations

import contextlib

from ..errors import NotFoundError
from ..records import Document, Entry
from ..store import Store


def entry_title(store: Store, entry: Entry, document: Document) -> str:
    """How a transfer names an entry: its document's title, or a passage of it as an
    answer's sources cite one ("book.txt #12 [lines 120-141]"; "a passage of book.txt" where
    the document holds none of its text now)."""
    if not entry.passage:
        return document.title
    held = store.passage_kv(entry.model).get(document.id, {})
    passage_id = next((p for p, e in held.items() if e == entry.id), None)
    if passage_id is None:
        return f"a passage of {document.title}"
    p = store.passage(passage_id)
    where = (f"page {p.page}" if p.page is not None else f"line {p.lines[0]}"
             if p.lines[0] == p.lines[1] else f"lines {p.lines[0]}-{p.lines[1]}")
    return f"{document.title} #{p.index} [{where}]"

def evicted_named(store: Store, caches: list[dict]) -> list[dict]:
    """Evicted caches (store.gc's `evicted_caches`), each with its document's title."""
    named = []
    for cache in caches:
        title = None
        if cache["document_id"] is not None:
            with contextlib.suppress(NotFoundError):
                document = store.document(cache["document_id"])
                title = f"a passage of {document.title}" if cache["passage"] else document.title
        named.append({**cache, "title": title})
    return named
