"""An entry's manifest on the remote tier: all another machine needs to use it with no prefill.

A manifest is a small JSON object, written after every chunk object it names (store.shared.remote).
It carries:
- the model fingerprint the KV was made under: a manifest is only ever read for that model;
- the entry's tokens (uint32 little-endian, base64): the other machine hashes them for its
  longest-prefix lookup, and its local copy is an ordinary entry keyed by them (store.caches.kv);
- the chunk size, the levels, and the size and SHA-256 of every (level, chunk) object; the
  object keys follow from these, so a manifest cannot point outside its fingerprint's folder;
- where the entry's window starts, if it has one (version 3; the window's parts are chunk
  objects numbered after the entry's chunks, store.caches.kv): older readers refuse such a
  manifest as newer rather than mistake its objects;
- the document (content hash, title, type, token count and text), so that the other machine
  can ask about it without having the file;
- the codec calibration its chunks need (its SHA-256), if any: an object of its own
  (store.shared.remote), uploaded before the manifest, fetched with the chunks (version 2; a
  version 1 manifest names none);
- whether it is a passage's entry (version 4): the KV of one passage of a long document,
  keyed by its content; its `document` then names only the document it was computed for
  (title, type "passage", no text), since a machine uses it only for a document of its own
  that has the same passage; older readers refuse it rather than take it for a document;
- where the passages' head ends, if the passage's entry extends it (version 5, `head_end`):
  the entry holds the tokens [0, head_end) of the head (the system prompt every passage
  starts with) as chunks of their own, cut from token 0, then the passage's tokens
  [head_end, token_end) cut from head_end; the other machine keeps the head as a root entry
  of its own (one it holds already, or one made from those chunks) and the passage as an
  entry extending it. Older readers refuse it rather than mistake its chunks' grid;
- a SHA-256 of everything above, checked on every read along with the rest.

Every manifest is written as version 7: the chunks a kvdesk now writes are blobs a kvdesk
from before cannot decode (their codec ids travel deflated), so it refuses the manifest as
newer and computes the entry itself, once, instead of pulling chunks it can never read and
recomputing at every question. Versions 2-6, written before, are still read: what they say
is in their fields (window_start, passage, head_end, head_calibration).

Only document and passage entries travel (a passage's with the head it extends, if any);
chats stay on the machine they were held on. Pure data: no I/O here, and never anything
about credentials or local paths.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
from dataclasses import asdict, dataclass
from functools import cached_property

from ..errors import CorruptObjectError
from ..tokens import chunk_spans, decode, encode, prefix_hashes


class NewerManifestError(CorruptObjectError):
    """A manifest a newer kvdesk wrote: not read here, and never written over."""


FORMAT = "kvdesk-kv-manifest"
VERSION = 7  # the newest this code reads
WRITES = 7  # the version every manifest is written as (the module says why)
_DIGEST = re.compile(r"^[0-9a-f]{64}$")


@dataclass(frozen=True)
class ChunkObject:
    nbytes: int
    sha256: str


@dataclass(frozen=True)
class RemoteDocument:
    content_hash: str
    title: str
    type: str
    n_tokens: int | None
    text: str


@dataclass(frozen=True)
class Manifest:
    fingerprint: str
    tokens: tuple[int, ...]
    chunk_size: int
    levels: tuple[str, ...]
    chunks: dict[str, tuple[ChunkObject, ...]]  # per level, in chunk order
    document: RemoteDocument
    created: float
    window_start: int | None = None  # the entry's window: positions [window_start, token_end)
    calibration: str | None = None
    passage: bool = False  # a passage's entry (version 4), not a document's
    head_end: int | None = None  # a passage's extending the passages' head [0, head_end) (v5)
    head_calibration: str | None = None  # the head's chunks' (with head_end; v6 if another)

    @property
    def token_end(self) -> int:
        return len(self.tokens)

    @cached_property
    def prefix_hash(self) -> bytes:
        return prefix_hashes(self.fingerprint, encode(self.tokens), [self.token_end])[0]

    @property
    def spans(self) -> list[tuple[int, int]]:
        """The token range of each chunk (a v5 manifest's: the head's, then the passage's)."""
        if self.head_end is None:
            return chunk_spans(0, self.token_end, self.chunk_size)
        return self.head_spans + chunk_spans(self.head_end, self.token_end, self.chunk_size)

    @property
    def head_spans(self) -> list[tuple[int, int]]:
        """The chunks of the head a v5 manifest's passage extends (its first ones); else none."""
        return [] if self.head_end is None else chunk_spans(0, self.head_end, self.chunk_size)

    @property
    def window_spans(self) -> list[tuple[int, int]]:
        """The window's parts (chunk indexes len(spans) on), if the entry has a window."""
        if self.window_start is None:
            return []
        return chunk_spans(self.window_start, self.token_end, self.chunk_size)

    @property
    def calibrations(self) -> tuple[str, ...]:
        """Every calibration the manifest's chunks need: the entry's, then its head's."""
        named = (self.calibration, self.head_calibration)
        return tuple(dict.fromkeys(c for c in named if c is not None))

    @property
    def own_head_calibration(self) -> bool:
        """Whether the head needs another calibration than the entry's: then named
        (`head_calibration`, since version 6)."""
        return self.head_end is not None and self.head_calibration != self.calibration

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for objects in self.chunks.values() for c in objects)

    def to_json(self) -> bytes:
        body = {
            "format": FORMAT,
            "version": WRITES,
            "fingerprint": self.fingerprint,
            "tokens": base64.b64encode(encode(self.tokens)).decode(),
            "chunk_size": self.chunk_size,
            "levels": list(self.levels),
            "chunks": {level: [[c.nbytes, c.sha256] for c in objects]
                       for level, objects in self.chunks.items()},
            "document": asdict(self.document),
            "created": self.created,
            **({} if self.window_start is None else {"window_start": self.window_start}),
        }
        if self.calibration is not None:
            body["calibration"] = self.calibration
        if self.passage:
            body["passage"] = True
        if self.head_end is not None:
            body["head_end"] = self.head_end
        if self.own_head_calibration:
            body["head_calibration"] = self.head_calibration
        return json.dumps({**body, "checksum": _checksum(body)}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, *, key: str, fingerprint: str,
                  prefix_hash: bytes | None = None) -> Manifest:
        """Parse and check a manifest read from `key` (CorruptObjectError if anything is off:
        its checksum, its fingerprint, its tokens against the key's prefix hash, its chunks)."""
        try:
            body = json.loads(data)
            checksum = body.pop("checksum")
            if body["format"] != FORMAT:
                raise CorruptObjectError(key, "not a kvdesk manifest")
            if body["version"] > VERSION:
                raise NewerManifestError(key, f"manifest version {body['version']} is newer "
                                              "than this kvdesk understands")
            if checksum != _checksum(body):
                raise CorruptObjectError(key, "manifest checksum mismatch")
            manifest = cls(
                fingerprint=body["fingerprint"],
                tokens=tuple(decode(base64.b64decode(body["tokens"], validate=True))),
                chunk_size=int(body["chunk_size"]),
                levels=tuple(body["levels"]),
                chunks={level: tuple(ChunkObject(int(n), str(d)) for n, d in objects)
                        for level, objects in body["chunks"].items()},
                document=RemoteDocument(**body["document"]),
                created=float(body["created"]),
                window_start=None if body.get("window_start") is None
                else int(body["window_start"]),
                calibration=body.get("calibration"),
                passage=bool(body.get("passage", False)),
                head_end=None if body.get("head_end") is None else int(body["head_end"]),
                # (named where it is not the entry's, null for none; else the entry's)
                head_calibration=body["head_calibration"] if body["version"] == 6 or (
                    body["version"] > 6 and "head_calibration" in body)
                else body.get("calibration") if body.get("head_end") is not None else None,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise CorruptObjectError(key, f"malformed manifest ({type(e).__name__})") from None
        manifest._check(key, fingerprint, prefix_hash)
        return manifest

    def _check(self, key: str, fingerprint: str, prefix_hash: bytes | None) -> None:
        if self.fingerprint != fingerprint:
            raise CorruptObjectError(key, f"made under model {self.fingerprint[:12]}, "
                                          f"found under {fingerprint[:12]}")
        if self.chunk_size <= 0 or not self.tokens or not self.levels:
            raise CorruptObjectError(key, "an empty entry")
        if self.calibration is not None and not _DIGEST.match(str(self.calibration)):
            raise CorruptObjectError(key, "it names a calibration that is not a SHA-256")
        if self.head_calibration is not None and (
                self.head_end is None or not _DIGEST.match(str(self.head_calibration))):
            raise CorruptObjectError(key, "it names a head's calibration that is not a SHA-256 "
                                          "of a head it extends")
        if prefix_hash is not None and prefix_hash != self.prefix_hash:
            raise CorruptObjectError(key, "its tokens do not hash to its key")
        if self.window_start is not None and not 0 <= self.window_start < self.token_end:
            raise CorruptObjectError(key, f"a window from token {self.window_start} does not "
                                          f"end at {self.token_end}")
        if self.head_end is not None and not (
                self.passage and self.window_start is None and 0 < self.head_end < self.token_end):
            raise CorruptObjectError(key, f"a head ending at token {self.head_end} does not "
                                          f"begin a passage's entry of {self.token_end} tokens "
                                          "without a window")
        n_chunks = len(self.spans) + len(self.window_spans)
        if set(self.chunks) != set(self.levels) or any(
                len(objects) != n_chunks or any(c.nbytes < 0 or not _DIGEST.match(c.sha256)
                                                for c in objects)
                for objects in self.chunks.values()):
            raise CorruptObjectError(key, f"its chunks do not match {n_chunks} chunks "
                                          f"x {list(self.levels)}")


def _checksum(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
