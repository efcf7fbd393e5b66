"""The disk budget for KV caches: least-recently-used entries are evicted first.

Only KV entries are ever evicted; documents, chats, messages and settings never are. An entry is
evicted together with every entry extending it (a chat's entry is useless without its document's).
Since reading a chain marks all of its entries used, parents are at least as recent as their
children and LRU order reaches leaves first anyway. Entries being written are never evicted, nor
any entry that one extends; an incomplete entry is removed once its writer is known to be gone:
a process of this host that no longer exists, or one that stopped refreshing the entry for
ABANDON_AFTER_S (a writer on another host sharing the directory, or a hung one). So is a
document whose attach was killed before its cache was stored (`unfinished`).

Room for a finished entry (`make_room`) is never made by evicting the entries its writer
keeps (`keep`: what the question storing it reads); when it fits only without them, it goes
itself. An entry stored ahead of need (written not to evict: a passage of the background
pass) is stored as least recently used (`fits`), so that it goes before anything a question
used, until a question reads it.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Collection

from ..datadir.db import Connections
from ..errors import BudgetFullError
from ..records import Entry
from .kv import subtree

DEFAULT_BUDGET_BYTES = 10 * 10**9
BUDGET_SETTING = "store.budget_bytes"
# A live writer refreshes its entry with every chunk, seconds apart; a quarter hour of silence
# means it is gone.
ABANDON_AFTER_S = 15 * 60
# A document's attach refreshes nothing while it prefills (minutes for a long one): one
# attached from another host is taken for abandoned only after a day.
ABANDON_DOCUMENT_AFTER_S = 24 * 3600
UNUSED = 0.0  # the last use of an entry stored ahead of need: before any entry read


def gone(pid: int | None, host: str | None) -> bool:
    """Whether the writer was a process of this host that has exited."""
    if pid is None or host != socket.gethostname() or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # it exists, as another user's process
        return False
    return False


def abandoned_writes(conn, now: float) -> list[tuple[int, int]]:
    """(entry id, bytes) of the entries whose writer is gone before finishing them: what the
    next `gc` removes."""
    pending = conn.execute(
        "SELECT id, (SELECT coalesce(sum(nbytes), 0) FROM kv_chunks WHERE entry_id = e.id),"
        " last_used, writer_pid, writer_host FROM kv_entries e WHERE NOT complete").fetchall()
    return [(entry_id, nbytes) for entry_id, nbytes, last_used, pid, host in pending
            if last_used < now - ABANDON_AFTER_S or gone(pid, host)]


def usage(db: Connections) -> int:
    """Bytes of every stored chunk, complete entries and entries being written alike."""
    return db.get().conn.execute("SELECT coalesce(sum(nbytes), 0) FROM kv_chunks").fetchone()[0]


def collect(db: Connections, budget_bytes: int, now: float, report: dict | None = None,
            keep: Collection[int] = (), progress: Callable[[int, int], None] | None = None,
            cancel: threading.Event | None = None) -> dict:
    """Drop abandoned writes, then evict LRU entries until usage fits the budget; report it.
    What each step did is added to `report` as it commits, so a caller that runs it again
    after an error (store.datadir.db.Connections.freeing) reports both runs' work. Never the
    entries `keep`, nor one they extend. `progress(freed, to free)` after each eviction;
    `cancel` stops before the next."""
    report = report if report is not None else {}
    for key in ("evicted_entries", "evicted_caches", "abandoned_entries", "abandoned_documents"):
        report.setdefault(key, [])
    report.setdefault("freed_bytes", 0)
    with db.write() as wdb:
        abandoned = abandoned_writes(wdb.conn, now)
        wdb.conn.executemany("DELETE FROM kv_entries WHERE id = ?", [(i,) for i, _ in abandoned])
    report["abandoned_entries"] += [entry_id for entry_id, _ in abandoned]
    report["freed_bytes"] += sum(nbytes for _, nbytes in abandoned)
    report["abandoned_documents"] += unfinished(db, now)
    used = usage(db)
    over, report["stopped"] = used - budget_bytes, False
    candidates = (
        db.get()
        # (Of entries last used alike, those nothing extends first: an entry stored ahead of
        # need may be extended by others stored so, and takes them with it.)
        .conn.execute("SELECT id FROM kv_entries e WHERE complete ORDER BY last_used, EXISTS"
                      " (SELECT 1 FROM kv_entries c WHERE c.parent_id = e.id), id")
        .fetchall()
    )
    for (candidate,) in candidates:
        if used <= budget_bytes:
            break
        if cancel is not None and cancel.is_set():
            report["stopped"] = True
            break
        # One short transaction per eviction, so the GUI's writes interleave with a long gc.
        with db.write() as wdb:
            tree = subtree(wdb.conn, candidate)
            if not tree or not all(complete for _, complete, _ in tree) or any(
                    entry_id in keep for entry_id, _, _ in tree):
                continue
            sizes = {entry_id: nbytes for entry_id, _, nbytes in tree}
            # (the model: one store holds every model's caches, and the budget is shared)
            caches = [{"entry": entry_id, "document_id": doc, "chat_id": chat,
                       "passage": bool(passage), "bytes": sizes[entry_id], "model": model}
                      for entry_id, doc, chat, passage, model in wdb.conn.execute(
                          "SELECT id, document_id, chat_id, passage, model FROM kv_entries"
                          f" WHERE id IN ({','.join('?' * len(sizes))})", list(sizes))]
            wdb.conn.execute("DELETE FROM kv_entries WHERE id = ?", (candidate,))
        report["evicted_entries"] += [entry_id for entry_id, _, _ in tree]
        report["evicted_caches"] += caches
        report["freed_bytes"] += sum(sizes.values())
        used -= sum(sizes.values())
        if progress is not None:
            progress(min(over, over - (used - budget_bytes)), over)
    return {**report, "bytes_after": used, "budget_bytes": budget_bytes}


def make_room(db: Connections, budget_bytes: int, entry: Entry, now: float,
              keep: Collection[int] = (), report: dict | None = None) -> list[dict]:
    """Entry `entry`, just finished, kept within the budget: the least recently used others
    evicted (never `keep`, nor the entries `entry` extends: store.gc's `evicted_caches`), or,
    when it does not fit with those alone, `entry` removed and nothing evicted
    ([its cache, "too_large"]: larger than the whole budget, or, with "beside", than what the
    entries kept leave of it)."""
    if usage(db) <= budget_bytes:
        return []
    conn = db.get().conn
    chain = _with_ancestors(conn, [entry.id])
    held = _with_ancestors(conn, [*keep, entry.id])
    chain_bytes, held_bytes = _bytes(conn, chain), _bytes(conn, held)
    if held_bytes > budget_bytes:  # evicting all else would not make room: it goes alone
        _delete(db, entry.id)
        return [{"entry": entry.id, "document_id": entry.document_id, "chat_id": entry.chat_id,
                 "passage": entry.passage, "bytes": chain_bytes, "model": entry.model,
                 "too_large": True,
                 **({"beside": held_bytes - chain_bytes} if chain_bytes <= budget_bytes else {})}]
    return collect(db, budget_bytes, now, report, keep=held)["evicted_caches"]


def fits(db: Connections, budget_bytes: int, entry: Entry, written: int) -> list[dict]:
    """Entry `written`, just finished not to evict others, removed again if it does not fit
    the budget (BudgetFullError), else stored as least recently used (`UNUSED`). An identical
    entry another writer stored first (adopted in its place) stays as it is: this write added
    nothing."""
    if entry.id != written:
        return []
    if usage(db) > budget_bytes:
        _delete(db, written)
        raise BudgetFullError(f"{usage(db) + entry.nbytes:,} bytes would not fit the storage "
                              f"budget of {budget_bytes:,}")
    with db.write() as wdb:
        wdb.conn.execute("UPDATE kv_entries SET last_used = ? WHERE id = ?", (UNUSED, written))
    return []


def _delete(db: Connections, entry_id: int) -> None:
    def work() -> None:
        with db.write() as wdb:
            wdb.conn.execute("DELETE FROM kv_entries WHERE id = ?", (entry_id,))
    db.freeing(work)


def _with_ancestors(conn, entry_ids: Collection[int]) -> set[int]:
    """`entry_ids` and every entry they extend."""
    ids = list(entry_ids)
    return {row[0] for row in conn.execute(
        "WITH RECURSIVE up(id) AS (SELECT id FROM kv_entries WHERE id IN"
        f" ({','.join('?' * len(ids))}) UNION SELECT e.parent_id FROM kv_entries e JOIN up"
        " ON e.id = up.id WHERE e.parent_id IS NOT NULL) SELECT id FROM up", ids)}


def _bytes(conn, entry_ids: Collection[int]) -> int:
    ids = list(entry_ids)
    return conn.execute("SELECT coalesce(sum(nbytes), 0) FROM kv_chunks WHERE entry_id IN"
                        f" ({','.join('?' * len(ids))})", ids).fetchone()[0]


def unfinished(db: Connections, now: float) -> list[int]:
    """Settle the documents whose attach was killed; return the ids of those removed.

    One whose cache was stored before the kill, or that a chat is about, is kept as attached
    (with no cache, like an evicted one); any other is removed, as if never attached.
    """
    removed = []
    with db.write() as wdb:
        rows = wdb.conn.execute(
            "SELECT id, attach_pid, attach_host, created, EXISTS (SELECT 1 FROM kv_entries"
            " WHERE document_id = d.id AND complete) OR EXISTS (SELECT 1 FROM chat_documents"
            " WHERE document_id = d.id) FROM documents d WHERE attach_pid IS NOT NULL"
        ).fetchall()
        for doc_id, pid, host, created, used in rows:
            if not (gone(pid, host) or (host != socket.gethostname()
                                        and created < now - ABANDON_DOCUMENT_AFTER_S)):
                continue
            if used:
                wdb.conn.execute("UPDATE documents SET attach_pid = NULL, attach_host = NULL"
                                 " WHERE id = ?", (doc_id,))
            else:
                wdb.conn.execute("DELETE FROM documents WHERE id = ?", (doc_id,))
                removed.append(doc_id)
    return removed


def attaching(db: Connections) -> dict[int, bool]:
    """{document id: whether its attach is still under way} of every unfinished document."""
    rows = db.get().conn.execute(
        "SELECT id, attach_pid, attach_host FROM documents WHERE attach_pid IS NOT NULL")
    return {doc_id: not gone(pid, host) for doc_id, pid, host in rows}
