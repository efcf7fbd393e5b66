"""How long the chat search takes (the window's Ctrl+K, `kvdesk chats --search`) over a large
library: chats of made-up messages, a search for a word no message holds (every message
read), one most hold, and one in another script (casefolded); beside the store's search,
its first version, which spaced every message before looking in it (measured in the same run).

    .venv/bin/python -m benchmarks.bench_chat_search [--chats 2000] [--messages 50]
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path

from store import Store


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--chats", type=int, default=2000)
    p.add_argument("--messages", type=int, default=50, help="per chat")
    args = p.parse_args()
    words = "the cache level chunk answer passage model river document office notes".split()
    rng = random.Random(0)
    with tempfile.TemporaryDirectory() as folder, Store(Path(folder) / "data") as store:
        with store._db.write() as db:  # (rows as the store keeps them, written at once)
            for c in range(args.chats):
                chat = db["chats"].insert({"title": f"chat {c}", "created": 0.0,
                                           "updated": 0.0}).last_pk
                db["messages"].insert_all(
                    {"chat_id": chat, "role": "user", "created": 0.0, "updated": 0.0,
                     "text": " ".join(rng.choices(words, k=270))
                     + (" Straße" if rng.random() < 0.01 else "")}
                    for _ in range(args.messages))
        count, chars = store._db.get().execute(
            "SELECT count(*), sum(length(text)) FROM messages").fetchone()
        print(f"{count:,} messages, {chars / 1e6:.0f} MB of text; load "
              f"{os.getloadavg()[0]:.1f}")
        for needle in ("zebra", "river document", "STRASSE"):
            t0 = time.perf_counter()
            found = store.chats_holding(needle)
            t1 = time.perf_counter()
            first = _spaced_first(store, needle)
            print(f"{needle!r}: {len(found):,} chats in {t1 - t0:.2f} s (first version: "
                  f"{len(first):,} in {time.perf_counter() - t1:.2f} s)")


def _spaced_first(store: Store, text: str) -> set[int]:
    """The first version's reading: every message spaced as the needle is, then folded."""
    needle, found = " ".join(text.split()).casefold(), set()
    for chat_id, message in store._db.get().execute("SELECT chat_id, text FROM messages"):
        if chat_id not in found and needle in " ".join(message.split()).casefold():
            found.add(chat_id)
    return found


if __name__ == "__main__":
    main()
