"""The codec calibrations kvdesk keeps, per model: which one new caches of a model are encoded
with, and the resolver through which the codec finds the one a stored chunk names.

A calibration (desktop_app.calibration.calibrate) is stored in the store under the fingerprint
of the
model it was made for (content-addressed: its bytes' SHA-256 is its id, which every chunk
blob encoded with it names). `latest` gives the newest one of a model; `Resolver` turns an id
into the parsed calibration for `codec.decode`, and only for the model it was made for: a
calibration of another model (or one whose own record says so) is never handed out, so such a
chunk is refused by the codec (CalibrationMissing), never decoded with the wrong transforms.
This module must never run a model (calibrate does) and never decode KV.
"""

from __future__ import annotations

import threading

import codec
import store as store_mod

from ..results import CalibrationInfo


def summary(cal: codec.Calibration) -> dict:
    """What the store lists about a calibration (its levels' bits and quality on the
    calibration text, the targets they were held to, the transform variant, how long it
    took)."""
    meta = cal.meta
    return {"variant": meta.get("variant"), "seconds": meta.get("seconds"),
            "model": meta.get("model"), "targets": meta.get("targets", {}),
            "levels": {name: {k: row.get(k) for k in ("bits_per_element", "kld", "top1")}
                       for name, row in meta.get("levels", {}).items()}}


def calibration_info(cal: codec.Calibration) -> CalibrationInfo:
    """A calibration as the front ends are told of it."""
    s = summary(cal)
    return CalibrationInfo(id=cal.id, model=s["model"] or "", created=cal.meta.get("created", 0.0),
                           seconds=s["seconds"], variant=s["variant"], levels=s["levels"],
                           targets=s["targets"])


def save(store: store_mod.Store, cal: codec.Calibration) -> str:
    """Keep a calibration under the model fingerprint it names; returns its id."""
    fingerprint = cal.meta.get("fingerprint")
    if not fingerprint:
        raise ValueError("a calibration to keep must name its model fingerprint")
    return store.put_calibration(fingerprint, cal.to_bytes(), summary(cal))


def latest(store: store_mod.Store, fingerprint: str) -> codec.Calibration | None:
    """The newest calibration made for this model, or None (not calibrated yet)."""
    for record in store.calibrations(fingerprint):
        found = Resolver(store, fingerprint)(record.id)
        if found is not None:
            return found
    return None


class Resolver:
    """id -> codec.Calibration of one model, for `codec.decode(..., calibrations=resolver)`;
    parsed calibrations are kept (a document's chunks all name the same one)."""

    def __init__(self, store: store_mod.Store, fingerprint: str):
        self.store, self.fingerprint = store, fingerprint
        self._cache: dict[str, codec.Calibration] = {}
        self._lock = threading.Lock()

    def __call__(self, cal_id: str) -> codec.Calibration | None:
        with self._lock:
            if cal_id in self._cache:
                return self._cache[cal_id]
        try:
            data = self.store.calibration(cal_id)
            cal = codec.Calibration.from_bytes(data)
        except (store_mod.StoreError, codec.CodecError):
            return None  # missing or damaged: the codec refuses the chunk, clearly
        owners = {r.model for r in self.store.calibrations(self.fingerprint) if r.id == cal_id}
        if self.fingerprint not in owners or cal.meta.get("fingerprint") != self.fingerprint:
            return None
        with self._lock:
            self._cache[cal_id] = cal
        return cal


class Calibrations:
    """Per model: the calibration its new caches are encoded with (the newest stored, read
    once), and the resolver its stored chunks are decoded through. A calibration adopted here
    (a run just finished) is stored and used by the next encode; chunks encoded before keep
    naming theirs, which stays stored while they need it."""

    def __init__(self, store: store_mod.Store):
        self.store = store
        self._current: dict[str, codec.Calibration | None] = {}
        self._resolvers: dict[str, Resolver] = {}
        self._lock = threading.Lock()

    def current(self, fingerprint: str) -> codec.Calibration | None:
        """The calibration new caches of this model use; None: model-independent defaults."""
        with self._lock:
            if fingerprint not in self._current:
                self._current[fingerprint] = latest(self.store, fingerprint)
            return self._current[fingerprint]

    def resolver(self, fingerprint: str) -> Resolver:
        with self._lock:
            if fingerprint not in self._resolvers:
                self._resolvers[fingerprint] = Resolver(self.store, fingerprint)
            return self._resolvers[fingerprint]

    def reread(self, fingerprint: str) -> codec.Calibration | None:
        """The newest calibration of this model as stored now (another process may have
        made one since `current` read it), used from now on."""
        found = latest(self.store, fingerprint)
        with self._lock:
            self._current[fingerprint] = found
        return found

    def adopt(self, cal: codec.Calibration) -> str:
        """Store a new calibration and encode its model's new caches with it; its id."""
        cal_id = save(self.store, cal)
        with self._lock:
            self._current[cal.meta["fingerprint"]] = cal
        return cal_id
