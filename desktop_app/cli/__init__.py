"""The `kvdesk` command line: a thin click layer over `App`.

Every command accepts `--json` and then prints exactly one JSON document on stdout; progress
and logs go to stderr. Errors the user can act on (a missing model, a bad setting, a corrupt
cache) are printed as one clear line (or `{"error": ...}` with --json) and exit with status 1:
never a traceback.

    base          the group, output, progress and Ctrl-C handling every command shares
    plain         a title as plain-text output shows it: one line, no control character
    chat          attach, ask, reopen, export, rm
    answers       what `ask` says of an answer beyond the engine's messages
    listings      docs, chats
    passages      what retrieval returns from a long document
    maintenance   info, verify, gc, backup, selfcheck, eval, gui
    remote        the shared cache: remote status, push, pull
    serve         the local OpenAI-compatible API
    commands      `main`: every command registered, and what ends one turned into its status
    process       `run`: the command as a whole process, its signals, its fast end
    streams       stdout and stderr closed, full or a closed pipe

The top of the stack: it may import every room, and none imports it. It never holds logic of
its own beyond parsing and printing, and never imports llama.cpp or the codec at module level
(a command answered by a running server loads neither). Importing the package itself imports
only `process` (and `streams`): `cli` and `main` import the commands when first asked for, so
that `run` settles the process's signals before that half second of imports, not after it.
"""

from __future__ import annotations

from .process import run

__all__ = ["cli", "main", "run"]


def __getattr__(name: str):
    if name in ("cli", "main"):
        from . import commands

        return getattr(commands, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
