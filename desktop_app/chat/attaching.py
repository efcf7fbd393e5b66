"""Attaching a document: extract its text, prefill its prefix once, encode and store its KV.

The prefix is what every chat about the document starts with (the system prompt and the
document). A document too long for the context is not prefilled at all: the user is told so
at once (a progress note), and it is split into passages, indexed and embedded (seconds for
a megabyte; `passages.index`), to be answered from the passages each question retrieves.
A document attached before under this model is not
computed again; with a shared cache configured, its entry is taken from the bucket instead of
prefilled when it is there, and shared after the attach when automatic pushing is on.
A cancel or failure stores nothing of a new document and leaves a known one as it was; a
kill leaves it unfinished (store.schema m007), listed so, until the next attach of the same
file finishes it or `gc` removes it. Two attaches of one document wait for each other (a
store lock, across processes): the second takes the first one's result.

Attach runs in its own model context, so documents compute while the user chats: beside the
user's turns, each up to about twice its time alone on two cores (benchmarks/RESULTS.md, "An
attach beside the questions"), and ahead of the background passes that share its context
(`ContextLock`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path

from store import Document, NotFoundError, Store

from ..errors import Cancelled, EngineError
from ..kv import speeds as speeds_mod
from ..kv.contexts import ATTACH, Contexts
from ..kv.evictions import fitting
from ..kv.kvcache import KVCache
from ..kv.levels import check_levels, quality_order, stored_by_default
from ..kv.sharing import Sharing
from ..kv.speeds import Speeds
from ..model.llamacalls import parts
from ..model.prompts import Prefix, Prompter, document_prefix
from ..model.runtime import Runtime
from ..passages.index import PassageIndex
from ..results import AttachResult, Progress
from . import documents
from .fairlock import ContextLock
from .turns import waited

ProgressFn = Callable[[Progress], None]


def _phase(progress: ProgressFn | None, phase: str,
           title: str) -> Callable[[int, int], None] | None:
    if progress is None:
        return None
    return lambda done, total: progress(Progress(phase, done, total, title))


def _count(rt: Runtime, text: str, cancel: threading.Event | None) -> int:
    """`text`'s tokens, counted a piece at a time (`llamacalls.parts`: as many as counted
    whole): a book's count takes seconds, and Ctrl-C stops it within one piece."""
    n = 0
    for piece in parts(text, rt.pieces_exact):
        if cancel is not None and cancel.is_set():
            raise Cancelled()
        n += len(rt.tokenize(piece))
    return n


def _counting(rt: Runtime, text: str, cancel: threading.Event | None,
              report: Callable[[int], None]) -> Callable[[str], int]:
    """`_count` for splitting `text`, which counts it a part at a time in order: the percent of
    it counted so far goes to `report` as it moves (the embedding after it, the last 1 %)."""
    counted, said = [0], [-1]

    def count(part: str) -> int:
        n = _count(rt, part, cancel)
        counted[0] += len(part)
        percent = min(99, 100 * counted[0] // max(1, len(text)))
        if percent != said[0]:
            said[0] = percent
            report(percent)
        return n
    return count


# What an attach says when it keeps a cache at lossless only (`levels.stored_by_default`).
UNCALIBRATED = ("stored lossless only until this model is calibrated (`kvdesk calibrate`, a "
                "few minutes once; the window and `kvdesk serve` calibrate by themselves): "
                "the model-independent levels lose answers on a sliding-window model")


class Attacher:
    def __init__(self, store: Store, contexts: Contexts, kv: KVCache, sharing: Sharing,
                 prompter: Prompter, speeds: Speeds, passages: PassageIndex):
        self.store = store
        self.passages = passages
        self.contexts = contexts
        self.kv = kv
        self.sharing = sharing
        self.prompter = prompter
        self.speeds = speeds
        self.lock = ContextLock()  # one job at a time in the attach context

    def attach(self, path: str | Path, *, levels: Sequence[str] | None = None,
               progress: ProgressFn | None = None, cancel: threading.Event | None = None,
               source: str | None = None) -> AttachResult:
        """Extract, prefill (or take from the shared cache), encode and store one document,
        then share it if automatic pushing is on; `source`: the user's file when `path` is a
        copy of it (an upload; "" when unknown). Raises DocumentError, Cancelled."""
        if levels is not None:
            check_levels(levels)  # a bad flag is refused before any work
        # A folder's walk says how far it is, hears Ctrl-C or Cancel, leaves the store's out.
        walking = _phase(progress, "extract", Path(path).resolve().name)
        # (before it is read: an edit of the file while it is attached is a change since)
        read_at = self.store.now()
        extracted = documents.extract(path, progress=walking, cancel=cancel,
                                      avoid=(self.store.data_dir,))
        extracted = replace(extracted, read_at=read_at)
        if source is not None:
            extracted = replace(extracted, source=source)
        if extracted.note:  # (said with the result too: `--json`, a log)
            extracted = replace(extracted, warnings=[extracted.note, *extracted.warnings])
        if progress:
            progress(Progress("extract", 1, 1, extracted.title, note=extracted.note))
        result = self._store(extracted, levels, progress, cancel)
        return replace(result, left_out=extracted.left_out) if extracted.left_out else result

    def prefill(self, doc_id: int, *, levels: Sequence[str] | None = None,
                progress: ProgressFn | None = None,
                cancel: threading.Event | None = None) -> AttachResult:
        """Compute a stored document's cache under the loaded model (after a model switch:
        its text is the truth), as attaching its file again would."""
        return self._store(documents.stored(self.store.document(doc_id), read=True,
                                            avoid=(self.store.data_dir,), cancel=cancel),
                           levels, progress, cancel)

    def _store(self, extracted: documents.Extracted, levels: Sequence[str] | None,
               progress: ProgressFn | None, cancel: threading.Event | None) -> AttachResult:
        result = self._attach(extracted, levels, progress, cancel)
        entry = self.store.document_entry(result.doc_id, self.contexts.get(ATTACH).fingerprint)
        if result.pulled or entry is None:  # None: evicted at once by a tiny storage budget
            return result
        # Outside the attach lock: an upload must not hold up the next document's prefill.
        pushed, notes = self.sharing.push_after_attach(
            entry.id, progress=_phase(progress, "push", result.title))
        return replace(result, pushed=pushed, warnings=[*result.warnings, *notes])

    def _attach(self, extracted: documents.Extracted, levels, progress, cancel) -> AttachResult:
        asked = quality_order(levels or ())
        check_levels(asked)
        title = extracted.title
        # One attach of a document at a time, across processes too: the second waits, then
        # takes the first one's result, or finishes what a killed one left unfinished.
        with self.lock.first(), waited(self.store.attach_turn, extracted.content_hash,
                                  cancel=cancel, progress=progress, title=title):
            self.contexts.warm_up()  # its kernels load while the model does
            self.contexts.encoding_soon()
            rt = self.contexts.get(ATTACH)
            levels = asked or quality_order(stored_by_default(self.kv.levels, rt,
                                                              self.kv.calibrations))
            known = {d.content_hash: d for d in self.store.documents()}
            existing = known.get(extracted.content_hash)
            # A document whose attach was killed is new again: this attach finishes it.
            new = existing is None or existing.attach_pid is not None
            if existing is not None and new:
                self.store.claim_document(existing.id)
            doc_tokens = _count(rt, extracted.text, cancel)
            prefix = None if doc_tokens > self.prompter.room(rt) else document_prefix(
                rt, (existing.title if existing else title, extracted.text),
                self.prompter.room(rt))
            if prefix is None or prefix.kept_tokens < prefix.doc_tokens:
                return self._attach_passages(rt, extracted, existing, new, doc_tokens,
                                             progress, cancel)
            doc = existing or self.store.add_document(
                extracted.content_hash, title, extracted.text, type=extracted.kind,
                source_path=extracted.source, n_tokens=prefix.doc_tokens, attaching=True,
                created=extracted.read_at)
            try:
                result = self._compute(rt, doc, prefix, extracted, levels, progress, cancel)
                if not (asked or result.reused) and levels != quality_order(self.kv.levels):
                    result = replace(result, warnings=[*result.warnings, UNCALIBRATED])
            except BaseException:
                # Nothing half-stored: a new document leaves no trace, a known one keeps
                # what it had (the entry writer aborts its own chunks).
                try:
                    if new:
                        self.store.delete_document(doc.id)
                except NotFoundError:  # (`rm doc` while it was computed)
                    raise EngineError(f"{title}: deleted (document {doc.id}) while it was "
                                      "being attached: nothing of it is stored") from None
                raise
            if new:
                self.store.finish_document(doc.id)
            return result

    def _compute(self, rt, doc: Document, prefix: Prefix, extracted: documents.Extracted,
                 levels: list[str], progress, cancel) -> AttachResult:
        """The document's cache under the loaded model: the stored one, the shared cache's,
        or prefilled, encoded and stored."""
        title = extracted.title
        self.store.set_document_tokens(doc.id, rt.fingerprint, prefix.doc_tokens,
                                       prefix.kept_tokens)
        warnings = list(extracted.warnings)
        entry = self.store.document_entry(doc.id, rt.fingerprint)
        if entry is not None:  # (a stored cache takes no other level: kept as it is)
            if other := [lvl for lvl in levels if lvl not in entry.levels]:
                warnings.append(
                    f"its cache is kept at {', '.join(entry.levels)}, as stored before: a "
                    f"stored cache takes no other level ({', '.join(other)}): `kvdesk rm doc "
                    f"{doc.id}`, then attach it again, stores it anew")
            return self._result(doc, prefix, entry.id, entry.levels if other else levels,
                                warnings, reused=True)
        try:
            t0 = time.perf_counter()
            pulled, notes = self.sharing.pull_for_attach(
                rt.fingerprint, prefix.tokens, levels, doc.id,
                progress=_phase(progress, "pull", title))
            warnings += notes
            if pulled is not None:
                return self._result(doc, prefix, pulled, levels, warnings,
                                    encode_s=time.perf_counter() - t0, pulled=True)
            # (The shared cache's answer, or its timeout, is neither the prefill's time nor
            # in the speed measured from it.)
            t0 = time.perf_counter()
            rt.reset()
            rt.prefill(prefix.tokens, cancel=cancel, progress=_phase(progress, "prefill", title),
                       logits=False)
            prefill_s = time.perf_counter() - t0
            self.speeds.prefill_tps = len(prefix.tokens) / max(prefill_s, 1e-6)
            t1 = time.perf_counter()
            evicted: list[dict] = []
            entry_id = self.kv.store_prefix(rt, prefix.tokens, levels, document_id=doc.id,
                                            progress=progress, cancel=cancel, title=title,
                                            evicted=evicted)
            encode_s = time.perf_counter() - t1
            warnings += self.kv.eviction_notes(evicted, rt.fingerprint) + fitting(
                evicted, self.store.budget_bytes)  # (not stored: what would be)
        except BaseException:
            rt.reset()
            raise
        speeds_mod.save(self.store, self.speeds)
        return self._result(doc, prefix, entry_id, levels, warnings,
                            prefill_s=prefill_s, encode_s=encode_s)

    def _attach_passages(self, rt: Runtime, extracted: documents.Extracted,
                         existing: Document | None, new: bool, doc_tokens: int,
                         progress: ProgressFn | None,
                         cancel: threading.Event | None) -> AttachResult:
        """A document longer than the context: said at once, then split, indexed and
        embedded (no prefill); a document already kept as passages keeps them (`new`: none
        yet, or a killed attach's, which this one finishes)."""
        title = existing.title if existing else extracted.title
        note = (f"{title}: {doc_tokens:,} tokens, more than the {self.prompter.room(rt):,} a "
                f"context of {rt.n_ctx:,} holds beside its questions and answers; it is kept "
                "as passages, and each question is answered from the passages retrieved for it")
        if progress:
            progress(Progress("split", 0, 100, title, note=note))  # (in percent throughout)
        t0 = time.perf_counter()
        doc = existing or self.store.add_document(
            extracted.content_hash, title, extracted.text, type=extracted.kind,
            source_path=extracted.source, n_tokens=doc_tokens, attaching=True,
            created=extracted.read_at)
        kept = count = 0 if new else len(self.store.passages(doc.id))
        try:
            if not count:
                def said(percent: int) -> None:
                    if progress:
                        progress(Progress("split", percent, 100, title))
                count = self._split(rt, doc.id, extracted, cancel, said)
            elif extracted.lines and extracted.source:  # attached again, its file read:
                # its lines as the file numbers them (never the stored text's guess)
                self.passages.renumber(doc.id, extracted.text, extracted.lines)
            if cancel is not None and cancel.is_set():
                raise Cancelled()
            self.store.set_document_tokens(doc.id, rt.fingerprint, doc_tokens, 0)
        except BaseException:
            if new:  # nothing half-stored of a new document
                self.store.delete_document(doc.id)
            raise
        if new:
            self.store.finish_document(doc.id)
        if progress:
            progress(Progress("split", 100, 100, title))
        return AttachResult(
            doc_id=doc.id, title=title, tokens=doc_tokens, kept_tokens=0, prefill_s=0.0,
            encode_s=round(time.perf_counter() - t0, 3), raw_bytes=0, stored_bytes={},
            reused=bool(kept), warnings=[*extracted.warnings, note],
            passages=count)

    def _split(self, rt: Runtime, doc_id: int, extracted: documents.Extracted,
               cancel: threading.Event | None, said: Callable[[int], None]) -> int:
        return self.passages.add(doc_id, extracted.text, extracted.kind,
                                 _counting(rt, extracted.text, cancel, said),
                                 pages=extracted.pages, line_numbers=extracted.lines,
                                 headings=extracted.headings)

    def split_stored(self, rt: Runtime, doc: Document,
                     cancel: threading.Event | None = None) -> int:
        """Keep a document attached whole as passages too (how many), for a chat whose
        context cannot hold it whole (a smaller context than at its attach, or beside the
        chat's other documents). Its file, when it still holds the same text, gives the
        passages its lines, pages and headings; else they are numbered by the stored text."""
        with waited(self.store.attach_turn, doc.content_hash, cancel=cancel, progress=None,
                    title=doc.title):
            if known := len(self.store.passages(doc.id)):  # (split meanwhile, elsewhere)
                return known
            found = documents.stored(doc, read=True, avoid=(self.store.data_dir,),
                                     cancel=cancel)
            return self._split(rt, doc.id, found, cancel, lambda _: None)

    def _result(self, doc: Document, prefix: Prefix, entry_id: int, levels: Sequence[str],
                warnings: list[str], *, prefill_s: float = 0.0, encode_s: float = 0.0,
                reused: bool = False, pulled: bool = False) -> AttachResult:
        sizes = self.store.entry_level_bytes([entry_id]).get(entry_id, {})
        layout = self.contexts.get(ATTACH).layout
        try:
            calibration = self.store.entry(entry_id).calibration
        except NotFoundError:  # not kept: larger than the whole storage budget (said)
            calibration = None
        return AttachResult(
            doc_id=doc.id, title=doc.title, tokens=prefix.doc_tokens,
            kept_tokens=prefix.kept_tokens, prefill_s=round(prefill_s, 3),
            encode_s=round(encode_s, 3), raw_bytes=layout.raw_bytes(len(prefix.tokens)),
            stored_bytes={lvl: sizes.get(lvl, 0) for lvl in levels}, reused=reused,
            warnings=warnings, pulled=pulled, calibration=calibration)
