"""How fast this machine reads, decodes and prefills: what the adaptive restore plans with.

`Speeds` holds the measured figures, updated as chunks stream and as text is prefilled; the
engine remembers them in the store between runs (`load`, `save`), so the first restore of a
session plans with this machine's speeds, not with priors.

It measures nothing itself and never reads chunks.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

from store import DamagedError, ReadOnlyError, Store

SETTING = "engine.speeds"

# Priors until the first measurement of a session (the engine keeps measured values).
DEFAULT_DECODE_MBPS = 1000.0  # fp16 output per second
DEFAULT_READ_MBPS = 2000.0  # a local SSD with a warm page cache
DEFAULT_REMOTE_MBPS = 50.0  # an object store over a LAN or a good internet link
DEFAULT_PREFILL_TPS = 140.0  # tokens per second: the default model on 2 cores


@dataclass
class Speeds:
    """Measured speeds, updated as chunks stream; persisted by the engine between runs."""

    decode_MBps: dict[str, float] = field(default_factory=dict)  # per level, fp16 output MB/s
    read_MBps: float = DEFAULT_READ_MBPS
    prefill_tps: float = DEFAULT_PREFILL_TPS
    remote_MBps: float = DEFAULT_REMOTE_MBPS

    def decode(self, level: str) -> float:
        return self.decode_MBps.get(level, DEFAULT_DECODE_MBPS)

    def observe_decode(self, level: str, out_bytes: int, seconds: float) -> None:
        if seconds > 0:
            now = out_bytes / 1e6 / seconds
            old = self.decode_MBps.get(level)
            self.decode_MBps[level] = now if old is None else 0.5 * old + 0.5 * now

    @classmethod
    def from_dict(cls, saved: dict) -> Speeds:
        """Speeds remembered by `as_dict` (priors for what was never measured)."""
        return cls(decode_MBps=dict(saved.get("decode_MBps", {})),
                   read_MBps=saved.get("read_MBps", DEFAULT_READ_MBPS),
                   prefill_tps=saved.get("prefill_tps", DEFAULT_PREFILL_TPS),
                   remote_MBps=saved.get("remote_MBps", DEFAULT_REMOTE_MBPS))

    def as_dict(self) -> dict:
        return {"decode_MBps": self.decode_MBps, "read_MBps": self.read_MBps,
                "prefill_tps": self.prefill_tps, "remote_MBps": self.remote_MBps}

    def observe_read(self, kind: str, MBps: float) -> None:
        """The bandwidth a whole restore measured, from the local store or the remote tier."""
        if kind == "remote":
            self.remote_MBps = MBps
        else:
            self.read_MBps = MBps


def load(store: Store) -> Speeds:
    """The speeds remembered; the priors where none are, or where the setting is damaged (the
    store has marked itself damaged, and the command warns: a measurement is only a cache)."""
    try:
        return Speeds.from_dict(store.setting(SETTING) or {})
    except DamagedError:
        return Speeds()


def save(store: Store, speeds: Speeds) -> None:
    """Keep the measured speeds for the next process; on a full disk (or a read-only data
    directory) they are kept in this one only: a measurement never stops an answer."""
    with contextlib.suppress(ReadOnlyError):  # (DiskFullError among them)
        store.set_setting(SETTING, speeds.as_dict())
