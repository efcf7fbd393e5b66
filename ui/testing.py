"""A scripted stand-in for `desktop_app.engine.Engine`, for UI tests and screenshots.

It implements `desktop_app.protocol.EngineAPI`, signature for signature (a test checks), with
canned data and realistic pauses (progress events, streamed tokens, cancellation, errors on
demand), so the window can be exercised in seconds without a model. It never loads a model or
opens the store, and the application never uses it: only tests and `ui.screenshots` do.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from desktop_app.chat.documents import DocumentError
from desktop_app.errors import Cancelled, EngineError
from desktop_app.model.prompts import Layout
from desktop_app.options import GenerationOptions, RestoreOptions
from desktop_app.passagepass import PassagePass
from desktop_app.protocol import ProgressFn, RestoreFn, TokenFn
from desktop_app.results import (
    READY,
    AskResult,
    AttachResult,
    CalibrationInfo,
    ChatInfo,
    DocumentInfo,
    MessageInfo,
    PrepState,
    Progress,
    RestoreEstimate,
    RestoreReport,
    Source,
)

DAY = 86400.0
N_CTX = 8192
CHUNK_TOKENS = 256  # the fake's chunk size, for the chunk counts of its restore reports
# Bytes of KV per token at each level: the default model's fp16 KV, then the codec's ratios.
BYTES_PER_TOKEN = {"lossless": 23040, "high": 5760, "balanced": 3600, "compact": 2160}
READ_MBPS = {"lossless": 900.0, "high": 400.0, "balanced": 350.0, "compact": 300.0}
BINARY_SUFFIXES = {".png": "a PNG image", ".jpg": "a JPEG image", ".zip": "a ZIP archive"}


def fake_answer(question: str) -> str:
    """A Markdown answer exercising what the chat view renders: emphasis, a list, code."""
    return (
        f"You asked: *{question.strip()}*.\n\nThe document says three things:\n\n"
        "1. the cache is **compressed** per chunk;\n2. chunks stream back in order;\n"
        "3. the first token comes before the last chunk.\n\n```python\n"
        "def restore(chunks):\n    # decode each chunk as it arrives\n"
        "    return [decode(c) for c in chunks]  # 16 chunks\n```\n"
    )


class FakeEngine:
    levels = ("lossless", "high", "balanced", "compact")  # a class attribute: read-only as used
    generation_defaults = GenerationOptions()  # what the window last set (frozen: shareable)
    model_name = "SmolLM2-135M-Instruct-Q4_1.gguf"

    def __init__(self, *, step_s: float = 0.01, token_s: float = 0.003, now: float | None = None):
        self.step_s = step_s  # pause per progress step: the engine's blocking work
        self.codec = PrepState(READY, 1, 1, "", 0.0, 0.0, 0)  # what codec_state() says
        self._calibration: CalibrationInfo | None = None
        self.token_s = token_s  # pause per streamed word
        self.now = now if now is not None else time.time()
        self.calls: list[tuple] = []  # (method, args...) for tests to inspect
        self.fail_next: dict[str, BaseException] = {}  # method -> exception raised once
        self.damage: str | None = None  # a test's stand-in for a damaged store
        self.budget_gb: float | None = None  # the storage budget set while running, if any
        self.hold: dict[str, threading.Event] = {}  # method -> event it waits for before working
        self.on_gui_thread: list[str] = []  # methods called on the main (the GUI's) thread
        self._lock = threading.Lock()
        self._docs: dict[int, DocumentInfo] = {}
        self._deleted: dict[int, str] = {}  # titles of the documents deleted
        self.pass_state = PassagePass()  # what passage_pass says (tests set it)
        self.as_text = False  # what passages_as_text says (tests set it)
        self.exact_said: dict[int, list[str]] = {}  # what exact_notes says, once (tests set it)
        self._chats: dict[int, ChatInfo] = {}
        self._messages: dict[int, list[MessageInfo]] = {}
        self._next_id = 1

    @property
    def storage_problem(self) -> str | None:
        return self.damage

    # -- canned data --------------------------------------------------------------------------

    def seed(self) -> FakeEngine:
        """Two documents and chats spread over today, yesterday, last week and last month."""
        report = self._add_doc("Attention Is All You Need.pdf", "pdf", 6120)
        notes = self._add_doc("release-notes.md", "markdown", 1480)
        # By calendar day, as the chat list groups them: whatever the hour `now` is.
        midnight = dt.datetime.combine(dt.date.fromtimestamp(self.now), dt.time()).timestamp()
        for title, docs, when in (
            ("What is multi-head attention?", [report], (midnight + self.now) / 2),
            ("Summarize the release notes", [notes], midnight - 0.8 * DAY),
            ("Compare the two documents", [report, notes], midnight - 3.5 * DAY),
            ("Positional encodings", [report], midnight - 40 * DAY),
        ):
            chat = self._add_chat(title, docs, when)
            self._add_message(chat, "user", title, chat.created)
            self._add_message(chat, "assistant", fake_answer(title), chat.created + 3)
        return self

    def _new_id(self) -> int:
        with self._lock:
            self._next_id += 1
            return self._next_id - 1

    def _add_doc(self, title: str, kind: str, tokens: int) -> int:
        doc_id = self._new_id()
        kept = min(tokens, N_CTX)
        self._docs[doc_id] = DocumentInfo(
            doc_id=doc_id, title=title, type=kind, tokens=tokens, kept_tokens=kept,
            cache_bytes=self._sizes(kept), status="ready", created=self.now)
        return doc_id

    @staticmethod
    def _sizes(kept: int) -> dict[str, int]:
        return {lv: kept * b for lv, b in BYTES_PER_TOKEN.items() if lv != "lossless"}

    def _add_chat(self, title: str, doc_ids: list[int], when: float) -> ChatInfo:
        chat = ChatInfo(chat_id=self._new_id(), title=title, doc_ids=list(doc_ids), messages=0,
                        created=when, updated=when)
        self._chats[chat.chat_id] = chat
        self._messages[chat.chat_id] = []
        return chat

    def _add_message(self, chat: ChatInfo, role: str, text: str, when: float,
                     stats: dict | None = None) -> None:
        msgs = self._messages[chat.chat_id]
        msgs.append(MessageInfo(message_id=self._new_id(), role=role, text=text, created=when,
                                stats=stats))
        self._chats[chat.chat_id] = replace(self._chats[chat.chat_id], messages=len(msgs),
                                            updated=when)

    def last_call(self, method: str) -> tuple:
        return next(c for c in reversed(self.calls) if c[0] == method)

    # -- helpers for the blocking work ----------------------------------------------------------

    def __getattribute__(self, name: str):
        """Every public method records a call made on the main (the GUI's) thread, whichever
        it is: the window must call none there."""
        value = object.__getattribute__(self, name)
        if name.startswith("_") or not callable(value):
            return value

        def recorded(*args, **kwargs):
            if threading.current_thread() is threading.main_thread():
                object.__getattribute__(self, "on_gui_thread").append(name)
            return value(*args, **kwargs)
        return recorded

    def _enter(self, method: str, *args) -> None:
        self.calls.append((method, *args))
        held = self.hold.get(method)
        if held is not None:
            held.wait(10)
        error = self.fail_next.pop(method, None)
        if error is not None:
            raise error

    def _step(self, cancel: threading.Event | None, pause: float | None = None) -> None:
        if cancel is not None and cancel.is_set():
            raise Cancelled("cancelled")
        time.sleep(self.step_s if pause is None else pause)

    def _prefix_tokens(self, doc_ids: list[int]) -> int:
        return sum(self._docs[d].kept_tokens for d in doc_ids if d in self._docs)

    def _restore(self, tokens: int, level: str, progress, cancel) -> RestoreReport:
        if level not in ("auto", *self.levels):  # as the engine refuses it
            raise EngineError(f"unknown level(s) [{level!r}]; known: {list(self.levels)}")
        chunks = max(1, -(-tokens // CHUNK_TOKENS))
        best = "high" if level in ("auto", "lossless") else level
        # A couple of chunks fall back to a cheaper level, as a time budget would make them.
        chunk_levels = [best if i < chunks - 2 else "balanced" for i in range(chunks)]
        t0 = time.perf_counter()
        for i in range(chunks):
            self._step(cancel, self.step_s / 4)
            if progress:
                progress(Progress("restore", i + 1, chunks))
        return RestoreReport(tokens=tokens, restore_s=time.perf_counter() - t0,
                             bytes_read=tokens * BYTES_PER_TOKEN[best],
                             chunk_levels=chunk_levels, recomputed_tokens=0)

    # -- the Engine API --------------------------------------------------------------------------

    def warm_up(self) -> None:
        self._enter("warm_up")

    def codec_state(self) -> PrepState:
        return self.codec

    def calibration(self) -> CalibrationInfo | None:
        return self._calibration

    def calibrate(self, *, progress: ProgressFn | None = None,
                  cancel: threading.Event | None = None) -> CalibrationInfo:
        self._enter("calibrate")
        stages = ("reference", "transforms", "sensitivity", "high", "balanced", "compact")
        for i, stage in enumerate(stages):
            self._step(cancel)
            if progress:
                progress(Progress("calibrate", round(100 * i / len(stages)), 100, stage))
        self._calibration = CalibrationInfo(
            id="c" * 64, model="fake.gguf", created=self.now, seconds=1.0, variant="centred",
            # Bits per value as the fake's sizes say: lossless is 16-bit.
            levels={lv: {"bits_per_element": 16 * b / BYTES_PER_TOKEN["lossless"],
                         "kld": 0.01, "top1": 0.95}
                    for lv, b in BYTES_PER_TOKEN.items() if lv != "lossless"},
            targets={"high": 0.02})
        return self._calibration

    def relevel(self, *, progress: ProgressFn | None = None,
                cancel: threading.Event | None = None) -> dict:
        self._enter("relevel")
        moved = [d for d in self._docs.values() if d.levels == "model-independent"]
        self._docs.update({d.doc_id: replace(d, levels="calibrated") for d in moved})
        return {"entries": len(moved), "computed": len(moved), "stopped": None}

    def close(self) -> None:
        self._enter("close")

    def attach(self, path: str | Path, *, levels: Sequence[str] | None = None,
               progress: ProgressFn | None = None, cancel: threading.Event | None = None,
               source: str | None = None) -> AttachResult:
        path = Path(path)
        self._enter("attach", path.name)
        if path.suffix.lower() in BINARY_SUFFIXES:
            raise DocumentError(f"{path.name}: this is {BINARY_SUFFIXES[path.suffix.lower()]}, "
                                "not a document kvdesk can read")
        words = len(" ".join(f.read_text(errors="replace") for f in sorted(path.rglob("*"))
                             if f.is_file()).split() if path.is_dir()
                    else path.read_text(errors="replace").split())
        tokens = max(1, int(words * 1.3))
        kept = min(tokens, N_CTX)
        if progress:
            progress(Progress("extract", 1, 1, path.name))
        steps = 10
        for phase in ("prefill", "encode", "store"):
            for i in range(steps if phase != "store" else 2):
                self._step(cancel)
                if progress:
                    progress(Progress(phase, i + 1, steps if phase != "store" else 2, path.name))
        doc_id = self._add_doc(path.name, "text", tokens)
        return AttachResult(doc_id=doc_id, title=path.name, tokens=tokens, kept_tokens=kept,
                            prefill_s=0.4, encode_s=0.1,
                            raw_bytes=kept * BYTES_PER_TOKEN["lossless"],
                            stored_bytes=self._docs[doc_id].cache_bytes)

    def prefill(self, doc_id: int, *, levels: Sequence[str] | None = None,
                progress: ProgressFn | None = None,
                cancel: threading.Event | None = None) -> AttachResult:
        self._enter("prefill", doc_id)
        info = self._docs[doc_id]
        for i in range(5):
            self._step(cancel)
            if progress:
                progress(Progress("prefill", i + 1, 5, info.title))
        self._docs[doc_id] = replace(info, status="ready",
                                     cache_bytes=self._sizes(info.kept_tokens))
        return AttachResult(doc_id=doc_id, title=info.title, tokens=info.tokens,
                            kept_tokens=info.kept_tokens, prefill_s=0.2, encode_s=0.05,
                            raw_bytes=info.kept_tokens * BYTES_PER_TOKEN["lossless"],
                            stored_bytes=self._docs[doc_id].cache_bytes)

    def switch_model(self) -> None:
        """As after a switch to another model: every document's cache is another model's."""
        for doc_id, info in self._docs.items():
            self._docs[doc_id] = replace(info, status="stale", cache_bytes={})

    def set_storage_budget(self, gb: float) -> dict:
        self._enter("set_storage_budget")
        self.budget_gb = gb
        return {"evicted_entries": [], "freed_bytes": 0}

    def documents(self) -> list[DocumentInfo]:
        self._enter("documents")
        time.sleep(self.step_s)
        return sorted(self._docs.values(), key=lambda d: d.created)

    def passages_around(self, doc_id: int, index: int, around: int = 30) -> list[Source]:
        self._enter("passages_around", doc_id, index)
        total = self._docs[doc_id].passages
        return [Source(100 + i, doc_id, i, f"Passage {i} of the document.", 0.0,
                       lines=(10 * i + 1, 10 * i + 9), heading=("Part",))
                for i in range(max(0, index - around), min(total, index + around + 1))]

    def chats(self) -> list[ChatInfo]:
        self._enter("chats")
        time.sleep(self.step_s)
        return sorted(self._chats.values(), key=lambda c: c.updated, reverse=True)

    def search_chats(self, text: str) -> dict[int, str]:
        self._enter("search_chats", text)
        return {c: m.text for c, ms in self._messages.items() for m in ms if text in m.text}

    def messages(self, chat_id: int) -> list[MessageInfo]:
        self._enter("messages", chat_id)
        time.sleep(self.step_s)
        return list(self._messages[chat_id])

    def new_chat(self, doc_ids: Sequence[int], title: str | None = None) -> ChatInfo:
        self._enter("new_chat", list(doc_ids))
        return self._add_chat(title or "New chat", list(doc_ids), time.time())

    def ask(self, question: str, *, chat_id: int | None = None, doc_ids: Sequence[int] = (),
            restore: RestoreOptions = RestoreOptions(),
            generation: GenerationOptions = GenerationOptions(),
            on_token: TokenFn | None = None, on_restore: RestoreFn | None = None,
            progress: ProgressFn | None = None,
            cancel: threading.Event | None = None) -> AskResult:
        self._enter("ask", question, chat_id, list(doc_ids), restore.level, generation)
        chat = self._chats[chat_id] if chat_id is not None else self._add_chat(
            question.strip().splitlines()[0][:60], list(doc_ids), time.time())
        return self._generate(chat, question, fake_answer(question), restore.level, on_token,
                              on_restore, progress, cancel)

    def regenerate(self, chat_id: int, *, restore: RestoreOptions = RestoreOptions(),
                   generation: GenerationOptions = GenerationOptions(),
                   on_token: TokenFn | None = None, on_restore: RestoreFn | None = None,
                   progress: ProgressFn | None = None,
                   cancel: threading.Event | None = None) -> AskResult:
        self._enter("regenerate", chat_id, restore.level)
        msgs = self._messages[chat_id]
        last = max((i for i, m in enumerate(msgs) if m.role == "user"), default=None)
        if last is None:  # as the engine says it
            raise EngineError("nothing to regenerate: the chat has no question yet")
        question = msgs[last].text  # asked again: its new turn replaces it once stored
        return self._generate(self._chats[chat_id], question,
                              fake_answer(question + " (again)"), restore.level, on_token,
                              on_restore, progress, cancel, replacing=len(msgs) - last)

    def _generate(self, chat, question, answer, level, on_token, on_restore, progress,
                  cancel, replacing: int = 0) -> AskResult:
        """As the engine answers: the question is stored with its answer, at the end, in
        place of the `replacing` last messages (a regenerated turn)."""
        t0 = time.perf_counter()
        report = self._restore(self._prefix_tokens(chat.doc_ids), level, progress, cancel)
        if on_restore:
            on_restore(report)
        ttft = None
        pieces = answer.split(" ")
        for i, word in enumerate(pieces):
            self._step(cancel, self.token_s)
            ttft = ttft or time.perf_counter() - t0
            if on_token:
                on_token(word if i == len(pieces) - 1 else word + " ")
        stats = {"tokens_generated": len(pieces), "ttft_s": ttft}
        del self._messages[chat.chat_id][len(self._messages[chat.chat_id]) - replacing:]
        self._add_message(chat, "user", question, time.time())
        self._add_message(chat, "assistant", answer, time.time(), stats)
        return AskResult(chat_id=chat.chat_id, answer=answer, ttft_s=ttft or 0.0,
                         restore_s=report.restore_s, bytes_read=report.bytes_read,
                         chunk_levels=report.chunk_levels, recomputed_tokens=0,
                         tokens_generated=len(pieces))

    def prepare(self, draft: str, *, chat_id: int | None = None, doc_ids: Sequence[int] = (),
                restore: RestoreOptions = RestoreOptions(),
                cancel: threading.Event | None = None) -> RestoreReport | None:
        self._enter("prepare", draft, chat_id, list(doc_ids), restore.level)
        return None

    def reopen(self, chat_id: int, *, restore: RestoreOptions = RestoreOptions(),
               progress: ProgressFn | None = None,
               cancel: threading.Event | None = None) -> RestoreReport:
        self._enter("reopen", chat_id, restore.level)
        chat = self._chats[chat_id]
        history = sum(len(m.text.split()) for m in self._messages[chat_id])
        return self._restore(self._prefix_tokens(chat.doc_ids) + history, restore.level,
                             progress, cancel)

    def rename_chat(self, chat_id: int, title: str) -> None:
        self._enter("rename_chat", chat_id, title)
        self._chats[chat_id] = replace(self._chats[chat_id], title=title)

    def delete_chat(self, chat_id: int) -> None:
        self._enter("delete_chat", chat_id)
        del self._chats[chat_id], self._messages[chat_id]

    def document_titles(self) -> dict[int, str]:
        return {**{d: f"{t} (deleted)" for d, t in self._deleted.items()},
                **{d: doc.title for d, doc in self._docs.items()}}

    def passage_pass(self) -> PassagePass:
        return self.pass_state

    def pause_passages(self, paused: bool) -> None:
        self._enter("pause_passages", paused)
        self.pass_state = replace(self.pass_state, paused=paused)

    def passages_as_text(self) -> bool:
        return self.as_text

    def exact_notes(self) -> dict[int, list[str]]:
        said, self.exact_said = self.exact_said, {}
        return said

    def delete_document(self, doc_id: int) -> list[int]:
        self._enter("delete_document", doc_id)
        self._deleted[doc_id] = self._docs.pop(doc_id).title
        return []

    def estimate(self, *, chat_id: int | None = None,
                 doc_ids: Sequence[int] = ()) -> RestoreEstimate:
        self._enter("estimate", chat_id, list(doc_ids))
        if chat_id is not None:
            doc_ids = self._chats[chat_id].doc_ids
        tokens = self._prefix_tokens(list(doc_ids))
        sizes = {lv: tokens * b for lv, b in BYTES_PER_TOKEN.items()}
        # A new chat's documents past the room the context keeps beside its turns: cut, or
        # left out, as the engine lays them out (a chat says so with its answers)
        room, shortened = N_CTX - min(1024, N_CTX // 4), []
        for doc in (self._docs[d] for d in doc_ids if chat_id is None and d in self._docs):
            kept, room = min(doc.kept_tokens, room), room - min(doc.kept_tokens, room)
            if kept < doc.tokens:
                shortened.append((doc.title, kept, doc.tokens))
        return RestoreEstimate(tokens=tokens, bytes=sizes,
                               seconds={lv: sizes[lv] / (READ_MBPS[lv] * 1e6) for lv in sizes},
                               notes=Layout((), (), (), tuple(shortened)).notes)

    def export_chat(self, chat_id: int, fmt: str = "markdown") -> str:
        self._enter("export_chat", chat_id, fmt)
        chat = self._chats[chat_id]
        return "\n\n".join([f"# {chat.title}"] + [f"**{m.role}**: {m.text}"
                                                  for m in self._messages[chat_id]])


class FakeLocalAPI:
    """A stand-in for the local API server the settings toggle (desktop_app.server.LocalAPI)."""

    def __init__(self):
        self.url: str | None = None
        self.calls: list[tuple] = []

    def start(self, settings) -> str:
        port = settings.server_port
        self.calls.append(("start", port, settings.ollama_port, settings.cors_origins))
        self.url = f"http://127.0.0.1:{port}/v1"
        return self.url

    def stop(self) -> None:
        self.calls.append(("stop",))
        self.url = None
