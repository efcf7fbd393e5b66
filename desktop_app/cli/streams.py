"""The process's standard streams as a script may leave them: closed before kvdesk started
(`>&-`, `2>&-`, a daemon's wrapper), on a full disk (`> /dev/full`), or a pipe whose reader
has gone (`| head`, `| true`).

`guard`, which only `process.run` calls, makes each of them one a command can write to.
stdout's failures raise `OutputFailed`, which the command line turns into one `Error:` line
and an exit status: 141 for a closed pipe, the status of a process SIGPIPE ended (as git's
is), so `set -o pipefail` reads `kvdesk docs | head -1` as a shell reads `git log | head -1`;
1 for any other failure. stderr's failures are dropped: a progress line or a note that cannot
be written is lost, and the work goes on, its JSON on stdout too. A stdout closed at start is
one whose every write fails; a stderr closed at start is /dev/null.

Imported before the commands (`process.run`), it must never import click or any other module
of kvdesk's, and it never ends a process.
"""

from __future__ import annotations

import errno
import os
import sys

CLOSED_PIPE = 141  # 128 + SIGPIPE (13; Windows has no signal.SIGPIPE to name it)
FAILED = 1


class OutputFailed(Exception):
    """stdout refused a write: its reader closed the pipe, its disk is full, it is closed. Not
    an OSError, so that no handler of the store's own disk errors takes it for one of them."""

    def __init__(self, error: OSError):
        super().__init__(f"cannot write the output: {error.strerror or error}")
        self.error = error

    @property
    def closed_pipe(self) -> bool:
        return self.error.errno == errno.EPIPE

    @property
    def status(self) -> int:
        return CLOSED_PIPE if self.closed_pipe else FAILED

    def error_line(self) -> str | None:
        """Its `Error:` line; None for a closed pipe, which, as for any command whose reader
        stops reading (`git log | head`), is no error to report."""
        return None if self.closed_pipe else f"Error: {self}"


class _Output:
    """sys.stdout, its failures raised as `OutputFailed` (whatever writes: click, print)."""

    def __init__(self, inner):
        self._inner = inner

    def write(self, text: str) -> int:
        try:
            return self._inner.write(text)
        except OSError as e:
            raise OutputFailed(e) from None

    def flush(self) -> None:
        try:
            self._inner.flush()
        except OSError as e:
            raise OutputFailed(e) from None

    def __getattr__(self, name: str):
        return getattr(self._inner, name)


class _Notes(_Output):
    """sys.stderr, its failures dropped: nothing could say them anyway."""

    def write(self, text: str) -> int:
        try:
            return self._inner.write(text)
        except OSError:
            return len(text)

    def flush(self) -> None:
        try:
            self._inner.flush()
        except OSError:
            pass


class _Closed:
    """stdout closed before kvdesk started: every write fails, and says why."""

    encoding = "utf-8"
    errors = "strict"

    def write(self, text: str) -> int:
        # (click tells a binary stream from a text one by writing b"" to it: refused, as a
        # text stream refuses it, that probe finds this one a text stream)
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        raise OSError(errno.EBADF, "stdout is closed")

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def guard() -> None:
    """Make stdout and stderr writable whatever state the process began in (see above)."""
    closed = sys.stdout is None
    _fill_closed_descriptors()
    sys.stdout = _Output(_Closed() if closed else sys.stdout)
    sys.stderr = _Notes(open(os.devnull, "w", encoding="utf-8") if sys.stderr is None
                        else sys.stderr)


def _fill_closed_descriptors() -> None:
    """/dev/null on each of descriptors 0-2 that is closed: otherwise the next file kvdesk
    opens takes its number, and whatever writes to "stderr" below Python (llama.cpp, ggml, a
    crash's report) writes into that file."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            null = os.open(os.devnull, os.O_RDWR)
            if null != fd:
                os.dup2(null, fd)
                os.close(null)

