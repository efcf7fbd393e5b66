"""`kvdesk` as a process: the console script, `python -m desktop_app` and the bundle run `run`.

A one-shot command (`kvdesk reopen`, `ask`, `docs`) is a whole process, and what the user waits
for ends when it exits. After the command, Python's own teardown frees every object of every
module it loaded (numpy, numba and its LLVM, llama.cpp), then the C libraries' static
destructors run: measured after a `kvdesk reopen` here, 0.35-0.45 s of a 2.2 s command, and
nothing the user needs (benchmarks/RESULTS.md, "Cold paths"). So once the command has returned
and every exit function has run as in a normal exit (temporary folders removed, numba's and
llvmlite's shutdown), `run` ends the process at once, with the status a normal exit would give.

Nothing here may end a process that `main` was merely called in (a test, an embedding program):
only `run` does, and only at exit.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys


class _Status:
    code = 0


def run() -> None:
    """`main` with sys.argv, then the fast end (`_end`) with its exit status."""
    from . import main

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
    except KeyboardInterrupt:
        status.code = 130
        raise
    except BaseException:  # printed by Python as a traceback before the exit functions run
        status.code = 1
        raise


def _exit_status(code: object) -> int:
    """The status Python's exit gives for SystemExit(code): None 0, an int itself, else 1 (the
    message is printed before the exit functions run)."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def _end(status: _Status) -> None:
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    os._exit(status.code)
