"""The library: documents, chats and messages as the user sees them, over the store.

A thin facade that turns store records into the engine's result records (`results`), names
what is missing in the engine's terms (`EngineError`: "no chat 7"), and aggregates listings in
the store (message counts, cache sizes per level) rather than loading rows to count them.

It never touches a model context or the codec: what a chat's tokens are under a model is the
sessions' business.
"""

from __future__ import annotations

import contextlib
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from store import (
    Chat,
    DamagedError,
    DiskFullError,
    Document,
    Entry,
    Message,
    NotFoundError,
    ReadOnlyError,
    Store,
)

from ..errors import EngineError, MissingError
from ..formats import folders
from ..kv.levels import cache_levels
from ..model.prompts import UNTITLED, title_of
from ..results import FINISH_WORDS, ChatInfo, DocumentInfo, MessageInfo, Source
from .documents import changed_since, file_hash

T = TypeVar("T")


def _found(get: Callable[[int], T], item_id: int, what: str) -> T:
    try:
        return get(item_id)
    except NotFoundError as e:
        raise MissingError(f"no {what} {item_id}") from e


class DocumentCaches:
    """Where each document's own cache is (its whole text's KV: not a passage's, nor a chat's)
    as seen from the model `fingerprint`: the one rule of what is ready and what is stale."""

    def __init__(self, store: Store | None, fingerprint: str):
        self.roots: dict[int, list[Entry]] = {}  # least recently used first
        for entry in store.entries() if store is not None else ():
            if entry.document_id is not None and entry.parent_id is None and not entry.passage:
                self.roots.setdefault(entry.document_id, []).append(entry)
        # Each document's most recently used cache under this model.
        self.current = {doc_id: [e for e in entries if e.model == fingerprint][-1]
                        for doc_id, entries in self.roots.items()
                        if any(e.model == fingerprint for e in entries)}
        # a long document's cache is its passages' KV
        self.passages = store.passage_counts() if store is not None else {}

    def stale(self, doc_id: int) -> bool:
        """Whether the document is cached only under other models (computing it under this
        one is worth it: a document kept as passages is not)."""
        return doc_id in self.roots and doc_id not in self.current and \
            not self.passages.get(doc_id)


class Library:
    def __init__(self, store: Store):
        self.store = store
        # chat: (the thread regenerating it, the turn it replaces)
        self._superseded: dict[int, tuple[int, frozenset[int]]] = {}

    # -- one item --------------------------------------------------------------------------

    def document(self, doc_id: int) -> Document:
        return _found(self.store.document, doc_id, "document")

    def chat(self, chat_id: int) -> Chat:
        return _found(self.store.chat, chat_id, "chat")

    def chat_documents(self, chat_id: int) -> list[Document]:
        return self.store.chat_documents(chat_id)

    def documents_of(self, chat_id: int | None, doc_ids: Sequence[int]) -> list[Document]:
        """A chat's documents; of a new one (None), those of `doc_ids`."""
        return ([self.document(d) for d in doc_ids] if chat_id is None
                else self.chat_documents(chat_id))

    def history(self, chat_id: int) -> list[Message]:
        """The chat's messages, oldest first, less a turn this thread regenerates
        (`superseding`)."""
        gone = self._superseding(chat_id)
        return [m for m in self.store.messages(chat_id) if m.id not in gone]

    def last_turn(self, chat_id: int) -> list[Message]:
        """The chat's last question and what followed it: what a regenerate replaces."""
        history = self.history(chat_id)
        last = max((i for i, m in enumerate(history) if m.role == "user"), default=None)
        if last is None:
            raise EngineError("nothing to regenerate: the chat has no question yet")
        return history[last:]

    @contextlib.contextmanager
    def superseding(self, chat_id: int, message_ids: Sequence[int]):
        """While it lasts the messages are out of the chat's history as this thread reads it
        (the regenerate's; a background pass still sees them, as they are stored), and the
        turn this thread adds to the chat replaces them (in one transaction); if none is, they
        stay, as they were."""
        self._superseded[chat_id] = (threading.get_ident(), frozenset(message_ids))
        try:
            yield
        finally:
            del self._superseded[chat_id]

    def _superseding(self, chat_id: int) -> frozenset[int]:
        thread, ids = self._superseded.get(chat_id, (None, frozenset()))
        return ids if thread == threading.get_ident() else frozenset()

    def computed_note(self, chat_id: int | None, docs: Sequence[Document], fp: str,
                      read: bool, computed: int, tokens: int) -> list[str]:
        """Why a restore of a chat's `tokens` (over `docs`, under model `fp`) computed
        `computed` of them from text, a cache `read` or not: its cache made under another model
        only (`stale_note`), or none of its own under this one (answered under another model,
        evicted under the budget, never kept: a reopen that takes seconds says why)."""
        if read and computed == tokens and (stale := self.stale_note(chat_id, docs, fp)):
            return stale
        if chat_id is None or not computed or self.store.chat_leaves(chat_id, fp, time.time()):
            return []
        other = any(e.chat_id == chat_id and e.model != fp and e.document_id is None
                    and not e.passage for e in self.store.entries())
        return ["this chat's own cache is " + (
            "stored under another model only (which answered it before; a model cannot read "
            "another's cache)" if other else "not stored under this model (evicted under the "
            "storage budget, or not kept when it was last answered)")
            + f": {computed:,} of its {tokens:,} tokens were computed from its text"]

    def stale_note(self, chat_id: int | None, docs: Sequence[Document], fp: str) -> list[str]:
        """What to tell the user when the cache of a chat over `docs` exists only under other
        models (a chat not created yet, None, has no entry of its own)."""
        ids = {d.id for d in docs}
        # A chat over passages reads neither its documents' entries nor their passages' under
        # another model: it computes its own under each.
        if ids & set(self.store.passage_counts()):
            ids = set()
        models = {e.model for e in self.store.entries() if not e.passage
                  and (e.document_id in ids or e.chat_id in {chat_id} - {None})}
        # One of this model's own not read (a level it does not hold, a damaged chunk) is
        # said by the restore, not blamed on another model.
        others = models - {fp}
        if not others or fp in models:
            return []
        return [f"the cache of this chat was made under another model or KV layout "
                f"(fingerprint {', '.join(sorted(o[:12] for o in others))}, now {fp[:12]}); "
                "it is not used: recomputing from text"]

    def unattached_notes(self, doc_ids: Sequence[int], fp: str) -> list[str]:
        """What a question about `doc_ids` computing their text says of those with no cache
        under `fp` whose attach is under way or was killed (taken before: it may end)."""
        attaching = self.store.attaching()  # (usually none: no entry is looked at then)
        current = DocumentCaches(self.store, fp).current if attaching else {}
        return [f"document {doc_id} is still being attached: its text was computed for this "
                "question" if attaching[doc_id] else f"document {doc_id}'s attach did not "
                "finish (stopped or killed): its text was computed for this question"
                for doc_id in dict.fromkeys(doc_ids)
                if doc_id in attaching and doc_id not in current]

    def stale_documents(self, doc_ids: Sequence[int], fingerprint: str) -> list[int]:
        """Those of `doc_ids` cached only under other models than `fingerprint` ("stale" in
        the listing), each once, in order."""
        caches = DocumentCaches(self.store, fingerprint)
        return [doc_id for doc_id in dict.fromkeys(doc_ids) if caches.stale(doc_id)]

    # -- listings --------------------------------------------------------------------------

    def documents(self, fingerprint: str, sliding_window: bool = False) -> list[DocumentInfo]:
        """Every document, with its cache under the model `fingerprint` (status "ready", its
        `cache_levels`), only under others ("stale") or none; a long document ("passages") is
        answered from its passages, its cache their KV. One whose first attach is under way
        has no cache yet ("attaching"), nor one whose attach or pull was killed ("unfinished":
        attaching or pulling it again finishes it, `gc` removes it)."""
        try:
            caches = DocumentCaches(self.store, fingerprint)
            # (a passage's KV is its document's whichever document's passage stored it)
            held = self.store.passage_kv(fingerprint)
            passage_kv = {doc_id: set(ids.values()) for doc_id, ids in held.items()}
            sizes = self.store.entry_level_bytes([e.id for e in caches.current.values()] + [
                i for ids in passage_kv.values() for i in ids])
            # (a passage entry's damage counts against each document holding its text, and so
            # does its passages' head's: every chain read from it is)
            heads = {e.id: e.parent_id for e in self.store.entries()
                     if e.passage and e.parent_id is not None}
            damaged = self.store.damaged([e.id for e in caches.current.values()] + [
                i for ids in passage_kv.values() for i in ids] + list(set(heads.values())))
            index = True
        except DamagedError:  # the caches' index alone (said): the documents still list
            caches, held, passage_kv, sizes, damaged, heads, index = (
                DocumentCaches(None, fingerprint), {}, {}, {}, {}, {}, False)
        current, passages = caches.current, caches.passages
        counts = self.store.document_tokens(fingerprint)
        attaching = self.store.attaching()
        all_docs = self.store.documents()
        out = []
        for doc in all_docs:
            entry = current.get(doc.id)
            status = "ready" if entry else "passages" if passages.get(doc.id) else (
                "stale" if caches.stale(doc.id) else "none" if index else "damaged")
            if doc.id in attaching and not entry:
                status = "attaching" if attaching[doc.id] else "unfinished"
            # Counted by attach under this model; a document attached by an older kvdesk has
            # its first model's count, and its prefix's tokens bound what was kept.
            tokens, kept = counts.get(doc.id, (doc.n_tokens or 0, 0))
            if doc.id not in counts and entry:
                kept = min(tokens, entry.token_end)
            changed = changed_since(doc.source_path, doc.content_hash, doc.created,
                                    avoid=(self.store.data_dir,))
            out.append(DocumentInfo(
                doc.id, doc.title, doc.type, tokens, kept if entry else 0,
                sizes.get(entry.id, {}) if entry else _summed(
                    sizes.get(i, {}) for i in passage_kv.get(doc.id, ())), status, doc.created,
                damaged.get(entry.id, 0) if entry else sum(damaged.get(i, 0) for i in (
                    passage_kv.get(doc.id, set()) | {heads.get(i) for i in passage_kv.get(
                        doc.id, ())})),
                passages.get(doc.id, 0),
                len(held.get(doc.id, {})), changed,
                _newer(doc, all_docs, self.store.data_dir) if changed else None,
                folders.file_count(doc.text) if doc.type == "folder" else None,
                cache_levels(entry, sliding_window) if entry else None))
        return out

    def changed_files(self, doc_ids: Sequence[int]) -> list[str]:
        """What a question about documents `doc_ids` should say of those whose file changed
        after it was attached: the answer uses the text attached then (a document deleted
        meanwhile says nothing)."""
        docs = []
        for doc_id in doc_ids:
            with contextlib.suppress(MissingError):
                docs.append(self.document(doc_id))
        docs = [d for d in docs if changed_since(d.source_path, d.content_hash, d.created,
                                                 avoid=(self.store.data_dir,))]
        every = self.store.documents() if docs else []
        return [f"the file of document {d.id} ({d.source_path}) changed after it was attached: "
                "answers use the text attached then; " + (
                    f"document {new} holds its new text" if new is not None else
                    "attach the file again to use the new text")
                for d in docs for new in [_newer(d, every, self.store.data_dir)]]

    def earlier_versions(self, doc_id: int) -> list[str]:
        """What attaching a file should say of documents attached from the same file before,
        with another text (each is kept: a chat may be about it)."""
        doc = self.document(doc_id)
        return [f"document {d.id} is an earlier version of this file, attached before it "
                f"changed: `kvdesk rm doc {d.id}` removes it" for d in self.store.documents()
                if d.source_path == doc.source_path and d.id < doc.id
                and d.content_hash != doc.content_hash and d.source_path]

    def chats(self) -> list[ChatInfo]:
        """Every chat, the most recently updated first. A chat over several documents that
        has answered is "exact" when a reopen of its latest context reads it exactly: a cache
        of its own holds that context's start (`_exact`); "blended" until then (blended
        answers are never stored: the exact context is computed in the background)."""
        counts = self.store.message_counts()
        docs = self.store.chat_document_ids()
        cached: dict[int, list[Entry]] | None = {}
        try:
            for e in self.store.entries():
                if e.chat_id is not None and not e.passage:
                    cached.setdefault(e.chat_id, []).append(e)
        except DamagedError:  # the caches' index alone (said): the chats still list
            cached = None

        def mode(chat_id: int) -> str | None:
            if len(docs.get(chat_id, [])) < 2 or not counts.get(chat_id) or cached is None:
                return None
            return "exact" if self._exact(chat_id, cached.get(chat_id, []),
                                          docs[chat_id]) else "blended"

        return [ChatInfo(c.id, c.title, docs.get(c.id, []), counts.get(c.id, 0), c.created,
                         c.updated, mode(c.id)) for c in self.store.chats()]

    def _exact(self, chat_id: int, entries: Sequence[Entry], doc_ids: Sequence[int]) -> bool:
        """Whether one of the chat's own `entries` holds the start of its latest context, which
        a reopen then reads exactly rather than blends (`Sessions.blendable`): its documents
        and, over passages, those its last answer was given (what a reopen lays out:
        `LongDocs.sources`). An entry is stored after its turn's answer (by the turn, or by the
        background pass), holding the passages of the last answer stored before it: one made
        for an earlier turn holds other passages when a follow-up changed them."""
        if not entries:
            return False
        kept = set(doc_ids)
        answers = [(m.created, tuple(s["text"] for s in m.stats["sources"]
                                     if s["document_id"] in kept))
                   for m in self.store.messages(chat_id) if m.role == "assistant"
                   and m.stats and m.stats.get("sources") is not None]
        latest = answers[-1][1] if answers else ()
        return any(next((held for at, held in reversed(answers) if at <= e.created), ()) == latest
                   for e in entries)

    def messages(self, chat_id: int) -> list[MessageInfo]:
        self.chat(chat_id)
        return [MessageInfo(m.id, m.role, m.text, m.created, m.stats)
                for m in self.store.messages(chat_id)]

    # -- changes ---------------------------------------------------------------------------

    def new_chat(self, doc_ids: Sequence[int], title: str | None = None) -> ChatInfo:
        docs = [self.document(d) for d in doc_ids]
        chat = self.store.create_chat(title or UNTITLED, [d.id for d in docs])
        return ChatInfo(chat.id, chat.title, [d.id for d in docs], 0, chat.created, chat.updated)

    def add_turn(self, chat_id: int | None, question: str, answer: str, *,
                 docs: Sequence[Document], **record) -> int:
        """Store a turn (`record`: Store.add_turn's stats and tokens) and return its chat's id;
        a new chat (None) about `docs` (as read before the answer) is created with it, so it
        never exists empty (about those of them not deleted meanwhile). On a full disk the
        store's reserve pays for a turn's text; where even that is spent, the error says the
        answer given is not kept, and what the chat still holds; a data directory gone (or its
        file found damaged), that the turn is not stored (said beside the answer given:
        `ChatSession.ask`)."""
        titles = {d.id: d.title for d in docs}
        doc_ids, deleted = list(titles), {}
        try:
            while chat_id is None:
                try:
                    return self.store.start_chat(title_of(question), doc_ids, question,
                                                 answer, deleted=deleted, **record).id
                except NotFoundError:
                    # A document deleted while its first answer was given: the chat is kept
                    # as one about it is once it is deleted (without it, its messages all
                    # there, its title kept: the chat's notes and exports name it).
                    present = self.store.document_titles()
                    left = [d for d in doc_ids if d in present]
                    if left == doc_ids:
                        raise
                    doc_ids = left
                    deleted = {d: t for d, t in titles.items() if d not in present}
            self.store.add_turn(chat_id, question, answer, **record,
                                replacing=sorted(self._superseding(chat_id)))
        except DiskFullError as e:
            kept = ("nor a chat made for them" if chat_id is None
                    else f"chat {chat_id} keeps its turns before it")
            raise DiskFullError(f"the answer given is not stored, nor its question ({kept}): "
                                f"{e}") from e
        except ReadOnlyError as e:  # (the data directory gone, its file found damaged)
            raise type(e)(f"this turn is not stored: {e}") from e
        return chat_id

    def name_untitled(self, chat_id: int, title: str) -> None:
        """Give a chat still untitled and empty its first question's title."""
        if self.chat(chat_id).title == UNTITLED and not self.store.message_counts().get(chat_id):
            self.store.rename_chat(chat_id, title)

    def rename_chat(self, chat_id: int, title: str) -> None:
        self.chat(chat_id)
        self.store.rename_chat(chat_id, title)

    def delete_chat(self, chat_id: int) -> None:
        self.chat(chat_id)
        self.store.delete_chat(chat_id)

    def delete_document(self, doc_id: int) -> list[int]:
        """Delete a document and its caches, and the caches of the chats about it (they hold
        its KV); those chats, which keep their messages and go on without it (`removed`),
        their context computed again at their next question."""
        self.document(doc_id)
        chats = sorted(c for c, docs in self.store.chat_document_ids().items() if doc_id in docs)
        self.store.delete_document(doc_id)
        return chats

    def removed(self, chat_id: int) -> list[str]:
        """A note when documents its last answer was given are gone since (said once: the
        next answer is given none of them)."""
        now = {d.id for d in self.chat_documents(chat_id)}
        last = next((m.stats for m in reversed(self.history(chat_id))
                     if m.role == "assistant" and m.stats), None) or {}
        gone = sorted(set(last.get("documents") or ()) - now)
        if not gone:
            return []
        titles = self.store.deleted_titles()
        which = ", ".join(f"{d} ({titles[d]})" if d in titles else str(d) for d in gone)
        return [f"document {which} of this chat was deleted: the chat goes on without it"
                if len(gone) == 1 else
                f"documents {which} of this chat were deleted: the chat goes on without them"]

    def titles(self) -> dict[int, str]:
        """{document id: title} of every document, and of those deleted that chats were
        about ("(deleted)" after the title): what a chat's sources are named by."""
        return {**{d: f"{t} (deleted)" for d, t in self.store.deleted_titles().items()},
                **self.store.document_titles()}

    def export_chat(self, chat_id: int, fmt: str = "markdown") -> str:
        """A chat as Markdown (its title, the documents it is about, then those its answers
        were given that are deleted since, "(deleted)"; each message, an answer naming the
        model that gave it, with the sources and quote of an answer over passages, each
        source naming its document) or JSON ("documents": [{"id", "title", "deleted"}],
        "messages": MessageInfo's)."""
        chat, msgs, titles = self.chat(chat_id), self.messages(chat_id), self.titles()
        now = self.store.chat_document_ids().get(chat_id, [])
        given = [d for m in msgs for d in (m.stats or {}).get("documents") or ()]
        kept, gone = self.store.document_titles(), self.store.deleted_titles()
        docs = [{"id": d, "title": kept[d] if d in now else gone[d], "deleted": d not in now}
                for d in dict.fromkeys([*now, *given]) if d in (kept if d in now else gone)]
        if fmt == "json":
            return json.dumps({"chat_id": chat.id, "title": chat.title, "documents": docs,
                               "messages": [m.as_dict() for m in msgs]}, indent=2)
        if fmt != "markdown":
            raise EngineError(f"unknown export format {fmt!r}: markdown or json")
        parts = [f"# {_literal(chat.title)}\n"]
        if docs:
            named = ", ".join(d["title"] + " (deleted)" * d["deleted"] for d in docs)
            parts.append(f"Documents: {_literal(named)}\n")
        for m in msgs:  # a message is Markdown already (models answer in it)
            stats = m.stats or {}
            by = f" ({_literal(stats['model'])})" if stats.get("model") else ""
            parts.append(f"**{'You' if m.role == 'user' else 'kvdesk' + by}:**\n\n{m.text}\n")
            if ended := FINISH_WORDS.get(stats.get("finish_reason")):
                parts.append(f"*({ended})*\n")
            if read := Source.read(stats.get("sources") or [], stats.get("evidence") or [],
                                   titles, stats.get("read_whole") or []):
                parts.append("".join(f"> {_literal(line)}  \n" for line in read))
        return "\n".join(parts)


def _literal(text: str) -> str:
    """`text` as Markdown shows it, as written: `__init__` in a heading or a quote stays
    itself, not "init" in bold."""
    return _MARKUP.sub(r"\\\g<0>", text)


_MARKUP = re.compile(r"[\\`*_<|~\[\]!]")  # what would turn text into markup, a link or HTML


def _summed(per_entry) -> dict[str, int]:
    """{level: bytes} of several entries together."""
    return dict(sum((Counter(sizes) for sizes in per_entry), Counter()))


def _newer(doc: Document, docs: Sequence[Document], data_dir: Path) -> int | None:
    """The document of `docs` holding the text that `doc`'s file (changed since) holds now
    (a folder's without kvdesk's data folder `data_dir`, as attach reads it)."""
    new = file_hash(doc.source_path, avoid=(data_dir,))
    return next((d.id for d in docs if d.content_hash == new and d.id != doc.id), None)
