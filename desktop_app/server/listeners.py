"""The sockets the server listens on: its own port, and Ollama's default one when it is free.

Binding them before uvicorn starts gives a clear error for a port in use (not uvicorn's exit
later) and lets port 0 pick a free port that the server file can name. Ollama's clients look
for it on port 11434 (the setting `ollama_port`): when that port is free, the server listens
there too, the same API on both; when it is taken (by Ollama itself, most likely), the server
runs without it and says so, and Ollama's API stays on the server's own port under /api.

It never serves anything: it hands uvicorn bound sockets.
"""

from __future__ import annotations

import logging
import socket

from ..errors import EngineError

log = logging.getLogger("kvdesk.server")


def bind(host: str, port: int) -> socket.socket:
    """A socket bound to host:port; EngineError naming the port if it cannot be."""
    try:
        return _bound(host, port)
    except OSError as e:
        raise EngineError(f"cannot serve on {host}:{port} ({e.strerror}): choose another "
                          "--port or --host") from None


def spare(host: str, port: int) -> socket.socket | None:
    """A socket bound to host:port if it is free, else None (said in the log)."""
    try:
        return _bound(host, port)
    except OSError as e:
        log.warning("Ollama's port %s is not free (%s; Ollama itself?): Ollama's clients can "
                    "use this server's own port", port, e.strerror)
        return None


def _bound(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock
