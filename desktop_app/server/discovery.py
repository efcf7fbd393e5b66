"""How a kvdesk command finds a server running on its data directory.

A running server writes `server.json` into the data directory (its address, its pid and, when
it has one, its API key; readable by the user only). A command reads it and asks the server's
health route, within half a second: it uses the server only if it answers for this very data
directory, model and context size. A file left by a server that died is ignored, and removed
by the next server to start.

It starts nothing and never loads a model.
"""

from __future__ import annotations

import fcntl
import json
import os
from pathlib import Path

FILE = "server.json"
LOCK = "server.lock"
TIMEOUT_S = 0.5


def write(data_dir: Path, url: str, api_key: str | None) -> None:
    path = data_dir / FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": url, "pid": os.getpid(), "api_key": api_key}, f)
    os.replace(tmp, path)


def claim(data_dir: Path) -> int | None:
    """Hold the data directory for a server starting in this process: an open descriptor of
    `server.lock`, locked (released when closed, or when the process dies); None while
    another process holds it, from its start, before its model loads and its file is
    written. A data directory where the lock cannot be made is not held against anyone."""
    try:
        fd = os.open(data_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def remove(data_dir: Path) -> None:
    """Remove the server file if this process wrote it."""
    path = data_dir / FILE
    try:
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
    except (OSError, ValueError):
        pass


def _probe(data_dir: Path) -> tuple[dict, dict] | None:
    """(the server file, its server's health) if a server answers for it."""
    if not (data_dir / FILE).is_file():
        return None
    import httpx  # only once there is a server to ask: it costs a command ~0.1 s to load

    try:
        info = json.loads((data_dir / FILE).read_text())
        key = info.get("api_key")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        health = httpx.get(f"{info['url']}/v1/kvdesk/health", headers=headers,
                           timeout=TIMEOUT_S, trust_env=False).json()
    except (OSError, ValueError, KeyError, TypeError, httpx.HTTPError):
        return None
    if health.get("pid") != info.get("pid") or health.get("data_dir") != str(data_dir.resolve()):
        return None
    return info, health


def live(data_dir: Path) -> str | None:
    """The address of a server answering for this data directory, if one does."""
    found = _probe(data_dir)
    return found[0]["url"] if found else None


def find(data_dir: Path, *, model: str, n_ctx: int | None) -> tuple[str, str | None] | None:
    """(url, api key) of a live server for this data directory, model and context, or None.

    `n_ctx` None (not set): a server whose context size was chosen for the model too; else a
    server with that context size, however it came by it."""
    found = _probe(data_dir)
    if found is None:
        return None
    info, health = found
    same_context = health.get("n_ctx_auto") is True if n_ctx is None else \
        health.get("n_ctx") == n_ctx
    if health.get("model") != str(model) or not same_context:
        return None
    return str(info["url"]), info.get("api_key")
