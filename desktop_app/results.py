"""The plain records the engine hands to its callers (CLI, GUI): progress, results, listings.

They are JSON-able through `as_dict()` and carry no live resources, so a GUI worker thread can
pass them through a Qt signal as they are. Its only logic is the wording both front ends share.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Self


class Record:
    def as_dict(self) -> dict:
        return asdict(self)  # type: ignore[arg-type]

    @classmethod
    def from_dict(cls, data: Mapping) -> Self:
        """The record `as_dict` gave, keys it does not know left out (a newer server's)."""
        known = {f.name for f in fields(cls)}  # type: ignore[arg-type]
        return cls(**{k: v for k, v in data.items() if k in known})


def size_text(nbytes: float) -> str:
    """A byte count as people read it: 950 B, 12.3 KB, 4.2 MB, 10.0 GB (CLI and window)."""
    for unit in ("B", "KB", "MB", "GB"):
        if nbytes < 1000 or unit == "GB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:,.1f} {unit}"
        nbytes /= 1000
    raise AssertionError("unreachable")


def counted(n: int, noun: str) -> str:
    """"1 token", "2,048 tokens": a count and its noun, as people write them."""
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


@dataclass(frozen=True)
class Progress(Record):
    """Work under way: phase is extract | prefill | encode | store | restore | recompute |
    pull | push (from and to the shared cache tier) | repair | wait (for another process's turn
    in the same chat) | split (a long document into passages, indexed) | exact (a blended
    chat's exact context) | backup (the store copied, `kvdesk backup`)."""

    phase: str
    done: int
    total: int
    title: str = ""
    # What the user should know now, not only with the result (a document longer than the
    # context: said before it is split); front ends show it once.
    note: str = ""


@dataclass(frozen=True)
class AttachResult(Record):
    doc_id: int
    title: str
    tokens: int  # the document's own token count
    kept_tokens: int  # how many of them fit the context and were cached
    prefill_s: float
    encode_s: float  # encoding and storing it (pulled: fetching and storing it)
    raw_bytes: int  # the fp16 KV of the cached prefix
    stored_bytes: dict[str, int]  # per codec level
    reused: bool = False  # the same document was already cached under this model
    warnings: list[str] = field(default_factory=list)
    pulled: bool = False  # its cache came from the shared cache tier, not from a prefill
    pushed: bool = False  # its cache is on the shared cache tier (pushed, or already there)
    # The codec calibration its chunks are encoded with (None: model-independent defaults).
    calibration: str | None = None
    # Longer than the context: kept as this many passages (0: its prefix holds it whole).
    passages: int = 0
    # A folder's files and folders not read: [{"path": from the folder, "why"}].
    left_out: list[dict[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class CalibrationInfo(Record):
    """A model's codec calibration: what its levels cost and kept on the calibration text."""

    id: str
    model: str  # the model file it was made with
    created: float
    seconds: float | None  # how long it took
    variant: str | None  # the transform chosen ("none", "centred", "klt")
    levels: dict[str, dict]  # {level: {"bits_per_element", "kld", "top1"}}
    targets: dict[str, float]  # the contract each level was held to, on that text


@dataclass(frozen=True)
class AttachFailure(Record):
    source: str
    error: str


@dataclass(frozen=True)
class RestoreReport(Record):
    """How a chat's or document's prefix came back into the model."""

    tokens: int  # tokens in the context after the restore
    restore_s: float  # bringing stored chunks back (0 when none were)
    bytes_read: int
    chunk_levels: list[str]  # per chunk: a codec level, or "text" (recomputed)
    recomputed_tokens: int
    messages: list[str] = field(default_factory=list)  # fallbacks, said to the user
    # "remote" when any KV it read was taken from the shared cache for it (streamed, or a
    # chat's later document or a long document's passages pulled first), else "local"
    source: str = "local"
    # A chat over several documents or passages: {"reused_tokens", "recomputed_tokens",
    # "quoted_tokens_reused", "mode"}, mode "blended" (the documents' own caches moved into
    # place: approximate) or "exact".
    blended: dict | None = None
    recompute_s: float = 0.0  # computing the recomputed tokens from text
    # Under "auto": chunks read below their best stored level, to fit the time budget at the
    # speeds measured then (another run may read them otherwise).
    adapted_chunks: int = 0

    @property
    def lossy_tokens(self) -> int:
        """How many of the context's first tokens came back at a lossy level: those restored,
        unless every chunk was read exactly ("lossless") or recomputed ("text")."""
        lossy = any(level not in ("lossless", "text") for level in self.chunk_levels)
        return self.tokens - self.recomputed_tokens if lossy else 0


def levels_summary(chunk_levels: list[str]) -> str:
    """E.g. "16 chunks: 14 high, 2 balanced" — how a restore brought its chunks back."""
    parts = [f"{n} {'recomputed from text' if level == 'text' else level}"
             for level, n in Counter(chunk_levels).most_common()]
    n = len(chunk_levels)
    return f"{n} chunk{'s' * (n != 1)}: {', '.join(parts)}"


def restore_phrase(report: RestoreReport) -> str:
    """How a context came back, e.g. "restored 4,096 tokens in 120 ms — 16 chunks: 14 high, 2
    balanced", with the tokens computed from text apart: "restored 203 of 1,973 tokens in 90
    ms — 1 chunk: 1 balanced; 1,770 computed in 850 ms" (the CLI and the window say it so)."""
    restored = report.tokens - report.recomputed_tokens
    computed = f"{report.recomputed_tokens:,} computed in {report.recompute_s * 1000:,.0f} ms"
    if restored <= 0:
        return f"nothing restored; {computed}"
    line = (f"restored {restored:,}" + (f" of {report.tokens:,}" if report.recomputed_tokens
                                       else "") + f" tokens in {report.restore_s * 1000:,.0f} ms")
    levels = [lvl for lvl in report.chunk_levels if lvl != "text"]
    if levels:
        line += f" — {levels_summary(levels)}"
    return f"{line}; {computed}" if report.recomputed_tokens else line


def location(page: int | None, lines: tuple[int, int], file: str | None = None) -> str:
    """Where a passage is, as a user finds it: "page 3" in a PDF, "src/db.py, lines 120-141"
    in a folder's file ("docs/report.pdf, page 3" its PDF's), else "lines 120-141"."""
    first, last = lines
    where = f"page {page}" if page is not None else \
        f"line {first}" if first == last else f"lines {first}-{last}"
    return f"{file}, {where}" if file else where


def in_file(kind: str, heading: Sequence[str]) -> tuple[str | None, tuple[str, ...]]:
    """A passage's (file, headings within it): a folder's passages sit first under their
    file's path (`formats.folders`); any other document's are in no file of their own."""
    if kind == "folder" and heading:
        return heading[0], tuple(heading[1:])
    return None, tuple(heading)


EARLIER = "an earlier question's"  # how a source kept from an earlier question is said
BEST = "best match"  # how the source retrieval scored above the others is said


@dataclass(frozen=True)
class Source(Record):
    """A passage an answer over a long document was given: its text and where it is."""

    passage_id: int
    document_id: int
    index: int  # its place in the document, from 0
    text: str
    score: float  # how relevant retrieval found it (higher: more)
    page: int | None = None  # a PDF's page, 1-based
    lines: tuple[int, int] | None = None  # else its first and last line, 1-based
    heading: tuple[str, ...] = ()  # the headings it sits under
    # Retrieved for an earlier question of the chat and kept in its context (not for this one)
    earlier: bool = False
    file: str | None = None  # a folder's passage: its file's path in the folder


    @classmethod
    def of(cls, hit, document_id: int) -> Source:
        """From a retrieval hit in a document (desktop_app.passages.retrieve's)."""
        return cls(hit.passage_id, document_id, hit.index, hit.text, float(hit.score),
                   hit.page, None if hit.page is not None else tuple(hit.lines),
                   tuple(hit.heading or ()), file=getattr(hit, "file", None))

    @classmethod
    def from_dict(cls, d: dict) -> Source:
        return cls(d["passage_id"], d["document_id"], d["index"], d["text"], d["score"],
                   d.get("page"), tuple(d["lines"]) if d.get("lines") else None,
                   tuple(d.get("heading", ())), d.get("earlier", False), d.get("file"))

    @property
    def location(self) -> str:
        return location(self.page, self.lines or (0, 0), self.file)

    def label(self, several: bool = False, titles: Mapping[int, str] | None = None) -> str:
        """How a user is told of it: "manual.md #12 [lines 120-141] Setup". Its document is
        named by its title whenever `titles` (documents' titles by id) is given ("document 4"
        for one deleted since); without them, only by its id when an answer's sources span
        `several` documents ("#12 [lines 120-141] Setup" otherwise)."""
        doc = (titles or {}).get(self.document_id, f"document {self.document_id}")
        return (f"{f'{doc} ' if several or titles is not None else ''}#{self.index} "
                f"[{self.location}]" + (f" {' > '.join(self.heading)}" if self.heading else "")
                + (f" ({EARLIER})" if self.earlier else ""))

    @staticmethod
    def best(sources: list[Source]) -> int | None:
        """Which of an answer's sources (listed in the order the model read them: document
        order) retrieval scored above all the others for its question, marked where they are
        listed; None where the best score is shared, or there is one source."""
        scores = sorted((s.score for s in sources if not s.earlier), reverse=True)
        if len(scores) < 2 or scores[0] == scores[1]:
            return None
        return next(j for j, s in enumerate(sources) if not s.earlier and s.score == scores[0])

    @staticmethod
    def read(sources: list[dict], evidence: list[str],
             titles: Mapping[int, str] | None = None, read_whole: list[dict] = ()
             ) -> list[str]:
        """The lines saying which documents an answer was given whole (`read_whole`:
        AskResult's), which passages, and what its question's turn quoted of them (each on
        one line); `titles`: documents' titles by id, where known (each source then names
        its document: `label`)."""
        read = [Source.from_dict(d) for d in sources]
        several = bool(read_whole) or len({s.document_id for s in read}) > 1
        best = Source.best(read)
        return [f"source: {d['title']} (read whole)" for d in read_whole] + [
            f"source: {s.label(several, titles)}" + (f" ({BEST})" if j == best else "")
            for j, s in enumerate(read)] + [
            f'quoted with the question: "{" ".join(q.split())}"' for q in evidence]

    def as_dict(self) -> dict:
        """`page` for a PDF's passage, else `lines`: the location a user can find it by."""
        out = {"passage_id": self.passage_id, "document_id": self.document_id,
               "index": self.index, "text": self.text, "score": round(self.score, 6),
               "heading": list(self.heading), "earlier": self.earlier}
        if self.page is not None:
            out["page"] = self.page
        else:
            out["lines"] = list(self.lines or ())
        if self.file:  # (lines within it)
            out["file"] = self.file
        return out


@dataclass(frozen=True)
class AskResult(Record):
    chat_id: int
    answer: str
    ttft_s: float
    restore_s: float
    bytes_read: int
    chunk_levels: list[str]
    recomputed_tokens: int
    tokens_generated: int
    messages: list[str] = field(default_factory=list)
    source: str = "local"  # as RestoreReport's: "remote" when the shared cache gave some KV
    documents: list[int] = field(default_factory=list)  # the chat's documents
    blended: dict | None = None  # as RestoreReport.blended (None: one document or none)
    # An answer over a long document: the passages it was given (Source.as_dict), else [].
    sources: list[dict] = field(default_factory=list)
    recompute_s: float = 0.0  # as RestoreReport's
    # The lines of those passages its question's turn quoted (`passages.evidence`), else [].
    evidence: list[str] = field(default_factory=list)
    # The chat's documents it was given whole beside those passages ({"document_id",
    # "title"}: `LongDocs.named`), else [].
    read_whole: list[dict] = field(default_factory=list)
    # "length": the answer ran to its limit (max_tokens, or the room left in the context) and
    # may be cut short; "cancelled": it was stopped (Ctrl-C, the window's stop button); "stop":
    # the model ended it, or it stopped going round in circles (messages say why);
    # `SERVER_STOPPED`: the kvdesk server answering it stopped (stored as "cancelled").
    finish_reason: str = "stop"
    # False: the answer was given, but neither it nor its question is stored (a full disk, the
    # data directory gone or found damaged: `messages` say why; a new chat's: `chat_id` 0).
    stored: bool = True
    model: str = ""  # the file name of the model that answered ("": stored before it was kept)

    def after(self, seconds: float, tokens: int) -> AskResult:
        """This answer after `tokens` computed in `seconds` before it (the user waited for
        them too: a document cached again under a switched model)."""
        return replace(self, ttft_s=self.ttft_s + seconds, recompute_s=self.recompute_s + seconds,
                       recomputed_tokens=self.recomputed_tokens + tokens)


SERVER_STOPPED = "server_stopped"  # a kvdesk server's stop cut it short: not a Ctrl-C's

# Why an answer ended, where the user should know it (a stored answer's `finish_reason`).
FINISH_WORDS = {"length": "stopped at the token limit: it may be cut short",
                "cancelled": "stopped before its end"}


# A document's cache status in the user's words (`kvdesk docs`, the window's list; each front
# end adds where to act: a command, a menu).
STATUS_WORDS = {
    "ready": "ready", "none": "not cached here", "attaching": "being attached",
    "stale": "cached for another model only (a question caches it for this one: computed, "
             "or taken from the shared cache)",
    "unfinished": "did not finish: attach or pull it again",
    "unknown": "cache status unknown: the model set is not found or cannot be used",
    "damaged": "cache unknown: the store's index of caches is damaged"}


# A long document under a model that keeps no passage KV yet (`EngineAPI.passages_as_text`:
# a sliding-window model, until its codec is calibrated); each front end adds how to calibrate.
PASSAGES_AS_TEXT = ("no passage's KV is kept until this model's codec is calibrated: each "
                    "question reads its passages as text, which is slower")


@dataclass(frozen=True)
class DocumentInfo(Record):
    doc_id: int
    title: str
    type: str
    tokens: int
    kept_tokens: int
    cache_bytes: dict[str, int]  # per level, under the current model
    # ready | passages (too long for the context: answered from its passages) | stale (cached
    # only under another model) | none | attaching | unfinished | damaged (the store's index
    # of caches cannot be read) | unknown (cached, but the model set is not found, so under
    # which is not known): `STATUS_WORDS` says each to the user
    status: str
    created: float
    # Chunks that cannot be read: set aside after a failed check, missing, or needing a codec
    # calibration that is missing or damaged (kvdesk verify --repair)
    damaged_chunks: int = 0
    passages: int = 0  # longer than the context: kept as this many passages (else 0)
    passages_cached: int = 0  # how many of them have their KV stored under the current model
    file_changed: bool = False  # its file holds another text now (answers use this one)
    newer: int | None = None  # then the document attached with the file's new text, if any
    files: int | None = None  # a folder's: how many files it joins
    # Its cache's levels, "calibrated" etc. (`kv.levels.cache_levels`); None: no cache here
    levels: str | None = None

    @property
    def changed_words(self) -> str:
        """How `file_changed` is said: "its file has changed since it was attached" (a
        folder's: "a file in it has changed ...")."""
        return (("a file in it" if self.type == "folder" else "its file")
                + " has changed since it was attached")


@dataclass(frozen=True)
class ChatInfo(Record):
    chat_id: int
    title: str
    doc_ids: list[int]
    messages: int
    created: float
    updated: float
    # Over several documents: "blended" until the exact prefix is stored, then "exact".
    kv_mode: str | None = None


@dataclass(frozen=True)
class MessageInfo(Record):
    message_id: int
    role: str  # user | assistant
    text: str
    created: float
    stats: dict | None = None


@dataclass(frozen=True)
class RestoreEstimate(Record):
    """What the quality slider's tooltip shows for a chat or document."""

    tokens: int
    bytes: dict[str, int]  # per level
    seconds: dict[str, float]  # per level, at the measured read and decode speeds
    # A new chat's documents the context cannot hold whole (cut, or left out), as its answer
    # will say (`Layout.notes`): told before it is asked. A chat's: how full its context is,
    # from 80 % on (`turns.fullness`: a front end offers a new chat over its documents).
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Completion(Record):
    """A client's conversation answered (the local API's chat completions)."""

    text: str
    finish_reason: str  # "stop" (end of turn or a stop string) | "length" | "cancelled"
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    report: RestoreReport  # how the prompt came into the model
    cached_tokens: int  # of the prompt, restored or kept rather than computed
    stored: bool  # whether the conversation's KV is now in the store
    messages: list[str] = field(default_factory=list)  # notes for the user
    # Over a document too long for the context: the passages the prompt was given, what
    # the last user message's turn quoted of them, and the documents read whole beside them
    # (as AskResult's).
    sources: list[dict] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    read_whole: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class ModelFile(Record):
    """One model file found on this machine, as `kvdesk models` lists it."""

    name: str  # what `--model NAME` accepts: an Ollama `name:tag`, or its path under its folder
    path: str
    source: str  # kvdesk (its own) | lmstudio | ollama | gpt4all | jan | huggingface | folder
    size_bytes: int
    architecture: str | None
    parameters: int | None
    quantization: str | None
    context_length: int | None
    kv_bytes_per_token: int | None
    sliding_window: int | None
    kv_window_bytes: int | None
    status: str  # supported | untested | refused | unreadable
    reason: str


# The phases of readying the codec (codec_prep), "idle" before it starts.
CHECKING, COMPILING, READY, FAILED = "checking", "compiling", "ready", "failed"


@dataclass(frozen=True)
class PrepState:
    """How far readying the codec's kernels is (desktop_app.calibration.codec_prep)."""

    phase: str  # CHECKING, COMPILING, READY or FAILED ("idle" before start)
    done: int  # steps finished
    total: int
    step: str  # the step running now ("" when none)
    elapsed_s: float
    left_s: float  # expected seconds until READY (0 when ready or failed)
    compiled: int  # kernels compiled by this preparation so far
    error: str | None = None

    @property
    def busy(self) -> bool:
        """Whether a codec call made now may have to wait for the preparation."""
        return self.phase in (CHECKING, COMPILING)

    @property
    def fraction(self) -> float:
        return 1.0 if not self.busy else self.done / max(1, self.total)
