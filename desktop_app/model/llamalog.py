"""llama.cpp's own output, kept off the user's terminal without silencing anyone else.

llama-cpp-python quiets a model load (`verbose=False`) by pointing the process's file
descriptors 1 and 2 at /dev/null for as long as the load lasts: whatever any other thread
prints meanwhile — a progress line, the server's log, another command's answer — is lost.
kvdesk loads with `verbose=True` instead, inside `loading()`, which
- routes llama.cpp's and ggml's log lines to Python's `logging`, logger "kvdesk.llama", at
  their levels; it does not propagate (llama.cpp's notices are not the user's business, and
  a load that fails is reported by the caller), so attach a handler to it to read them,
- drops the banners llama-cpp-python's constructor prints to sys.stdout and sys.stderr from
  the loading thread only; other threads' writes pass through as they are.

It must never touch file descriptors, and never hide what another thread writes.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import sys
import threading
from collections.abc import Iterator

import llama_cpp

log = logging.getLogger("kvdesk.llama")
log.propagate = False
log.addHandler(logging.NullHandler())

# ggml_log_level: NONE, INFO, WARN, ERROR, DEBUG, CONT (a continuation of the last line)
_LEVELS = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.WARNING, 3: logging.ERROR,
           4: logging.DEBUG}
_last = [logging.DEBUG]


@llama_cpp.llama_log_callback
def _to_logging(level: int, text: bytes, _user_data: ctypes.c_void_p) -> None:
    at = _last[0] if level == 5 else _LEVELS.get(level, logging.DEBUG)
    _last[0] = at
    if log.isEnabledFor(at):
        log.log(at, "%s", text.decode("utf-8", "replace").rstrip("\n"))


class _ThreadFilter:
    """A text stream that drops the writes of threads that asked to be quiet."""

    def __init__(self, inner, quiet: threading.local):
        self._inner = inner
        self._quiet = quiet

    def write(self, text: str) -> int:
        # A text stream's refusal of bytes, quiet or not: click tells a binary stream from a
        # text one by writing b"" to it and caches what it found, so a quiet thread's echo
        # that swallowed the probe made every later echo, from any thread, write bytes here.
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if getattr(self._quiet, "on", False):
            return len(text)
        return self._inner.write(text)

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


_quiet = threading.local()
_installed = threading.Lock()
_done = False


def _install() -> None:
    global _done
    with _installed:
        if _done:
            return
        llama_cpp.llama_log_set(_to_logging, ctypes.c_void_p(0))
        sys.stdout = _ThreadFilter(sys.stdout, _quiet)
        sys.stderr = _ThreadFilter(sys.stderr, _quiet)
        _done = True


@contextlib.contextmanager
def loading() -> Iterator[None]:
    """Around `llama_cpp.Llama(..., verbose=True)`: llama.cpp's lines go to logging, the
    constructor's prints from this thread go nowhere, nothing else changes."""
    _install()
    _quiet.on = True
    try:
        yield
    finally:
        _quiet.on = False
