"""The engine's model contexts and the codec's warm-up around them (desktop_app/kv/contexts.py):
the warm-up starts before a model loads, gives way to restores, builds per-shape tables only
in long-running processes, and readies every kernel a restore's first decodes use."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from desktop_app.calibration.calibrations import Calibrations
from desktop_app.kv import contexts as contexts_mod
from desktop_app.kv.contexts import CHAT, Contexts
from desktop_app.model.layout import ModelLayout
from store import Store

ROOT = Path(__file__).resolve().parent.parent
LAYOUT = ModelLayout(model_hash="m" * 16, n_layer=2, n_head_kv=1, head_dim=64, cache_type="f16",
                     v_trans=False, llama_cpp_version="test")


class StubRuntime:
    """What Contexts reads of a loaded model (no model is run here)."""

    def __init__(self, loaded: threading.Event | None = None):
        if loaded is not None:
            loaded.wait(10)  # a model still loading
        self.layout, self.n_ctx, self.model_path = LAYOUT, 1024, Path("stub.gguf")
        self.fingerprint = LAYOUT.fingerprint

    def close(self) -> None:
        pass


@pytest.fixture
def steps(monkeypatch):
    """precompile's steps replaced by quick ones that record when they ran."""
    from codec import precompile

    ran: list[str] = []
    monkeypatch.setattr(precompile, "steps", lambda shape, levels: [
        precompile.Step(n, lambda n=n: ran.append(n)) for n in ("kernels a", "kernels b")])
    return ran


@pytest.fixture
def tables(monkeypatch):
    calls: list[tuple] = []
    monkeypatch.setattr(contexts_mod.streaming, "warm_up",
                        lambda levels, shapes, cal, cancel, pause: calls.append(
                            (tuple(levels), shapes, cal)))
    return calls


@pytest.fixture(autouse=True)
def no_stamp(monkeypatch):
    """Every test here starts as if no run had ever stamped numba's cache as complete."""
    monkeypatch.setattr(contexts_mod.jitcache, "kernels_cached", lambda levels: False)


def make(tmp_path, factory, background: bool) -> Contexts:
    store = Store(tmp_path / "data")
    return Contexts(store, factory, model_path="stub.gguf", levels=("high", "compact"),
                    chunk_tokens=256, calibrations=Calibrations(store), background=background)


def test_the_kernels_are_readied_while_the_model_still_loads(tmp_path, steps, tables):
    loading = threading.Event()
    ctx = make(tmp_path, lambda: StubRuntime(loading), background=True)
    ctx.warm_up()
    getter = threading.Thread(target=ctx.get, args=(CHAT,))
    getter.start()
    ctx.wait_codec()  # while the model has not finished loading
    assert steps == ["kernels a", "kernels b"] and not tables
    loading.set()
    getter.join()
    ctx.wait_warm()
    # then the model's chunk shape, at its levels
    assert tables == [(("high", "compact"), [(2, 256, 64)], None)]
    ctx.close()


def test_the_warm_up_waits_while_a_restore_runs(tmp_path, steps, tables):
    ctx = make(tmp_path, StubRuntime, background=True)
    with ctx.restoring():
        ctx.warm_up()
        time.sleep(0.3)
        assert steps == []  # the restore goes first
    ctx.wait_codec()
    assert steps == ["kernels a", "kernels b"]
    ctx.close()


def test_a_one_shot_process_builds_no_tables_ahead_and_closes_at_once(tmp_path, steps, tables):
    """A one-shot command exits as soon as it has answered: its warm-up readies the kernels
    only, and while a restore holds it back, closing does not wait for it."""
    ctx = make(tmp_path, StubRuntime, background=False)
    ctx.get(CHAT)
    ctx.warm_up()
    ctx.wait_warm()
    assert steps == ["kernels a", "kernels b"] and tables == []
    ctx.close()

    held = make(tmp_path / "other", StubRuntime, background=False)
    with held.restoring():
        held.warm_up()
        t0 = time.perf_counter()
        held.close()  # the warm-up, waiting for the restore, stops
        assert time.perf_counter() - t0 < 1.0
    assert steps == ["kernels a", "kernels b"]  # nothing more ran


def test_a_one_shot_runs_no_warm_up_when_every_kernel_is_cached(tmp_path, steps, tables,
                                                                  monkeypatch):
    """Its restore loads its kernels from the cache itself; a warm-up would only compete with
    the imports. The window and a server warm up all the same."""
    asked = []
    monkeypatch.setattr(contexts_mod.jitcache, "kernels_cached",
                        lambda levels: asked.append(levels) or True)
    ctx = make(tmp_path, StubRuntime, background=False)
    ctx.warm_up()
    ctx.get(CHAT)
    ctx.wait_warm()
    assert steps == [] and asked == [["high", "compact"]]
    assert ctx.codec_state().phase == "ready" and not ctx.codec_state().busy
    ctx.close()

    window = make(tmp_path / "window", StubRuntime, background=True)
    window.warm_up()
    window.wait_codec()
    assert steps == ["kernels a", "kernels b"]
    window.close()


_COVERED = """
import json, sys
import numpy as np
import codec
from codec import precompile
from numba.core.registry import CPUDispatcher
from desktop_app.calibration.codec_prep import CodecPrep
from desktop_app.kv.levels import DEFAULT_LEVELS

def signatures():
    found = {}
    for name, mod in list(sys.modules.items()):
        if name.startswith("codec"):
            for attr, f in vars(mod).items():
                if isinstance(f, CPUDispatcher):
                    found[f"{name}.{attr}"] = len(f.signatures)
    return found

prep = CodecPrep(precompile.SMALL_SHAPE, DEFAULT_LEVELS)  # as Contexts.warm_up makes it
prep.start()
prep.wait()
assert prep.state().phase == "ready", prep.state()
before = signatures()
golden = sys.argv[1]
cal = codec.Calibration.from_bytes(open(golden + "/calibration.kvcl", "rb").read())
for name in ("high", "balanced", "compact", "calibrated-high"):
    blob = open(f"{golden}/{name}.kvc", "rb").read()
    info = codec.peek(blob)
    n_layer, n_tok, n_ch = info.n_layer, info.n_tokens, info.channels
    # as a restore decodes: into a state buffer's views, K token-major, V both ways
    head, layer = 12, n_tok * n_ch * 2
    buf = bytearray(3 * n_layer * (head + layer))
    views = [np.ndarray((n_layer, n_tok, n_ch), np.float16, buf,
                        offset=head + i * n_layer * (head + layer), strides=(head + layer, *inner))
             for i, inner in enumerate([(2 * n_ch, 2), (2 * n_ch, 2), (2, 2 * n_tok)])]
    codec.decode(blob, calibrations={cal.id: cal})
    codec.decode(blob, out=(views[0], views[1]), calibrations={cal.id: cal})
    codec.decode(blob, out=(views[0], views[2]), calibrations={cal.id: cal})
after = signatures()
print(json.dumps({k: (before.get(k, 0), v) for k, v in after.items() if v != before.get(k, 0)}))
"""


def test_the_warm_up_readies_every_kernel_a_restore_decodes_with(tmp_path):
    """In a fresh process: after the warm-up, decoding stored blobs of every default level and
    a calibrated one, as a restore does, loads no kernel signature the warm-up did not."""
    golden = ROOT / "tests" / "fixtures" / "codec" / "golden"
    out = subprocess.run([sys.executable, "-c", _COVERED, str(golden)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {}


def test_a_one_shot_warm_up_stops_once_the_model_has_loaded(tmp_path, monkeypatch, tables):
    """Past the model's load, a one-shot command's warm-up would only compete with the
    restore that follows: it ends at its next step."""
    from codec import precompile

    ran, loaded = [], threading.Event()

    def first():
        ran.append("first")
        loaded.wait(10)  # still running when the model has loaded

    monkeypatch.setattr(precompile, "steps", lambda shape, levels: [
        precompile.Step("first", first), precompile.Step("second", lambda: ran.append("x"))])

    ctx = make(tmp_path, StubRuntime, background=False)
    ctx.warm_up()
    while not ran:
        time.sleep(0.01)
    ctx.get(CHAT)
    loaded.set()
    ctx.wait_codec()
    assert ran == ["first"] and ctx.codec_state().phase == "failed"
    ctx.close()


def test_encodings_tables_wait_for_the_first_restore(tmp_path, steps, tables):
    """No restore needs them: built right at start they would slow the first reopen."""
    ctx = make(tmp_path, StubRuntime, background=True)
    ctx.warm_up()
    ctx.get(CHAT)
    ctx.wait_codec()
    time.sleep(0.3)
    assert tables == []
    with ctx.restoring():
        pass
    deadline = time.monotonic() + 10
    while not tables and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tables == [(("high", "compact"), [(2, 256, 64)], None)]
    ctx.close()


def test_the_first_step_decodes_the_newest_entrys_stored_chunks(tmp_path, monkeypatch):
    """What a reopen decodes first, from what is stored: chunk 0 of the most recently used
    entry at each warmed level it has, with its model's calibrations; unreadable ones are
    skipped, never raised."""
    import codec
    from desktop_app.kv import streaming

    store = Store(tmp_path / "data")
    store.register_model("model-a", "/a.gguf", {})
    kv = np.random.default_rng(0).standard_normal((2, 256, 64)).astype(np.float16)
    for n, levels in ((1, ("high", "compact")), (2, ("compact", "balanced"))):
        with store.write_entry("model-a", range(n * 1000, n * 1000 + 300),
                               levels=levels) as writer:
            for span in writer.spans:
                for level in levels:
                    writer.put_chunk(span.chunk_index, level,
                                     codec.encode(kv, kv, level) if level != "balanced"
                                     else b"not a blob")
    decoded, asked = [], []
    real = codec.decode
    monkeypatch.setattr(codec, "decode", lambda blob, calibrations=None: (
        decoded.append(real(blob, calibrations=calibrations)[0].shape)))
    streaming.warm_up_restore(store, ["high", "balanced", "compact"],
                              lambda fp: asked.append(fp))
    # the second entry is the newest: its compact chunk decoded, its balanced one unreadable
    assert decoded == [(2, 256, 64)] and asked == ["model-a"]


def test_numba_waits_for_the_first_restore_where_the_restore_needs_none(tmp_path, monkeypatch,
                                                                        steps, tables):
    """With the restore's kernels compiled ahead of time and numba's all cached, loading
    numba's (a second of imports) would only slow the first reopen: it waits for one to end
    (or an encode, or a few idle seconds)."""
    monkeypatch.setattr(contexts_mod.jitcache, "kernels_cached", lambda levels: True)
    monkeypatch.setattr(contexts_mod.aot, "load", lambda: object())
    ctx = make(tmp_path, StubRuntime, background=True)
    ctx.warm_up()
    ctx.get(CHAT)
    time.sleep(0.3)
    assert steps == []
    with ctx.restoring():
        pass
    deadline = time.monotonic() + 10
    while len(steps) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert steps == ["kernels a", "kernels b"]
    ctx.close()


def test_closing_ends_the_wait_for_a_first_restore_at_once(tmp_path, monkeypatch, steps):
    monkeypatch.setattr(contexts_mod.jitcache, "kernels_cached", lambda levels: True)
    monkeypatch.setattr(contexts_mod.aot, "load", lambda: object())
    ctx = make(tmp_path, StubRuntime, background=True)
    ctx.warm_up()
    time.sleep(0.1)
    t0 = time.monotonic()
    ctx.close()
    assert time.monotonic() - t0 < contexts_mod.JIT_IDLE_S / 2 and steps == []
