"""`kvdesk` as a process: the console script, `python -m desktop_app` and the bundle run `run`.

A one-shot command (`kvdesk reopen`, `ask`, `docs`) is a whole process, and what the user waits
for ends when it exits. After the command, Python's own teardown frees every object of every
module it loaded (numpy, numba and its LLVM, llama.cpp), then the C libraries' static
destructors run: measured after a `kvdesk reopen` here, 0.35-0.45 s of a 2.2 s command, and
nothing the user needs (benchmarks/RESULTS.md, "Cold paths"). So once the command has returned
and every exit function has run as in a normal exit (temporary folders removed, numba's and
llvmlite's shutdown), `run` ends the process at once, with the status a normal exit would give.

The process's signals are settled here too. Ctrl-C or SIGTERM while the commands' modules
import (half a second, before anything is done) ends it at once, quietly: status 130 or 143,
and with --json the `Cancelled` document every stopped command prints. From then on SIGTERM
(what `timeout`, systemd and cron's wrappers send) does whatever Ctrl-C does at that moment:
a cancel where a command stops cleanly, the window's and the server's own stop; only the exit
status tells them apart, 143 (128 + SIGTERM) where Ctrl-C's is 130. The streams are made
writable first (`streams.guard`).

Light: it imports nothing of kvdesk's but `streams` before the signals are settled. Nothing
here may end a process that `main` was merely called in (a test, an embedding program): only
`run` does, and only at exit or before the commands are imported.
"""

from __future__ import annotations

import atexit
import itertools
import logging
import os
import signal
import sys

from . import streams

# Exit status of a command Ctrl-C stopped (128 + SIGINT, as shells report it): a script tells
# it from a failure (1); SIGTERM's, 128 + 15.
INTERRUPTED = 130
TERMINATED = 143
STOPPED_EARLY = "stopped before the command began: nothing was done"
# (written as it is: the json module may be importing as a signal stops the imports)
_STOPPED_JSON = f'{{\n  "error": "{STOPPED_EARLY}",\n  "kind": "Cancelled"\n}}\n'


class _Status:
    code = 0


_terminated = False


def terminated() -> bool:
    """Whether SIGTERM, not Ctrl-C, stopped this process's command (said so by its notes)."""
    return _terminated


def run() -> None:
    """`main` with sys.argv, then the fast end (`_end`) with its exit status."""
    streams.guard()
    early = _stop_early()
    from . import main  # the commands, and all they import

    for sig, handler in early.items():
        signal.signal(sig, handler)
    if early.get(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _as_ctrl_c)
    status = _Status()
    # Registered before the command runs, so that every exit function the command's imports
    # register runs before this one (they run last-registered first). logging's and
    # filelock's, registered when this package was imported, come after it: logging is shut
    # down here, and the OS releases a process's file locks when it ends.
    atexit.register(_end, status)
    try:
        main()
    except SystemExit as e:
        status.code = _exit_status(e.code)
        raise
    except KeyboardInterrupt:  # (between main's handlers: click makes the rest "Aborted.")
        status.code = INTERRUPTED
    except BaseException:  # printed by Python as a traceback before the exit functions run
        status.code = 1
        raise


def _stop_early() -> dict:
    """Ctrl-C and SIGTERM end the process at once until the commands are imported; the
    handlers they had (one a parent set to ignore the signal keeps it)."""
    def stop(signum, frame) -> None:
        if wants_json(sys.argv[1:]):
            _say(sys.stdout, _STOPPED_JSON)
        _say(sys.stderr, STOPPED_EARLY[0].upper() + STOPPED_EARLY[1:] + ".\n")
        os._exit(TERMINATED if signum == signal.SIGTERM else INTERRUPTED)

    found = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig, handler in found.items():
        if handler != signal.SIG_IGN:
            signal.signal(sig, stop)
    return found


def _say(stream, text: str) -> None:
    try:
        stream.write(text)
        stream.flush()
    except Exception:  # (an output that failed: nothing else to say it with)
        pass


def _as_ctrl_c(signum, frame) -> None:
    """SIGTERM: what the Ctrl-C handler in place does (a command's cancel, click's "Aborted."),
    or KeyboardInterrupt where Ctrl-C is ignored (a script's background job)."""
    global _terminated
    _terminated = True
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):
        raise KeyboardInterrupt
    handler(signal.SIGINT, frame)


def wants_json(args: list[str]) -> bool:
    """Whether a command line asks for one JSON document on stdout, a refusal's too: --json,
    or export's --format json (the same, as its help says), before any `--`."""
    before = args[:args.index("--")] if "--" in args else args
    return "--json" in before or "--format=json" in before or any(
        pair == ("--format", "json") for pair in itertools.pairwise(before))


def _exit_status(code: object) -> int:
    """The status Python's exit gives for SystemExit(code): None 0, an int itself, else 1 (the
    message is printed before the exit functions run)."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _end(status: _Status) -> None:
    logging.shutdown()
    code = TERMINATED if _terminated and status.code == INTERRUPTED else status.code
    try:
        sys.stdout.flush()
    except streams.OutputFailed as e:  # what was left for the exit to write, lost: said
        line = e.error_line()
        if code == 0 and line:
            _say(sys.stderr, line + "\n")
        code = code or e.status
    except (OSError, ValueError):  # (not guarded: `run` stood in for by a test)
        pass
    try:
        sys.stderr.flush()
    except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
        pass
    os._exit(code)
