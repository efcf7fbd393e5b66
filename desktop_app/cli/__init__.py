"""The `kvdesk` command line: a thin click layer over `App`.

Every command accepts `--json` and then prints exactly one JSON document on stdout; progress
and logs go to stderr. Errors the user can act on (a missing model, a bad setting, a corrupt
cache) are printed as one clear line (or `{"error": ...}` with --json) and exit with status 1:
never a traceback.

    base          the group, output, progress and Ctrl-C handling every command shares
    plain         a title as plain-text output shows it: one line, no control character
    chat          attach, ask, reopen, export, rm
    listings      docs, chats
    passages      what retrieval returns from a long document
    maintenance   info, verify, gc, backup, selfcheck, eval, gui
    remote        the shared cache: remote status, push, pull
    serve         the local OpenAI-compatible API
    process       `run`: the command as a whole process, ended without Python's teardown

The top of the stack: it may import every room, and none imports it. It never holds logic of
its own beyond parsing and printing, and never imports llama.cpp or the codec at module level
(a command answered by a running server loads neither).
"""

from __future__ import annotations

import sys

import click

from ..errors import Cancelled, is_user_error
from . import base, chat, listings, maintenance, passages, remote, serve  # noqa: F401 - each registers its commands
from .base import cli
from .process import run

__all__ = ["cli", "main", "run"]


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    _writable_stdout()
    base.json_printed = False
    base.running = None
    base.interrupted = False
    try:
        cli.main(args=args, prog_name="kvdesk", standalone_mode=False)
    except click.exceptions.Abort:  # a second Ctrl-C (the first stops the work cleanly)
        if base.wants_json(args) and not base.json_printed:  # stdout: one JSON document
            click.echo(base.json_text({"error": "interrupted", "kind": "Interrupted"}))
        click.echo("Aborted.", err=True)
        sys.exit(base.INTERRUPTED)
    except click.exceptions.NoArgsIsHelpError as e:  # `kvdesk`, `kvdesk remote`: as -h does
        click.echo(e.ctx.get_help())
    except click.UsageError as e:  # a malformed command line: one Error line, and where to look
        hint = f" (`{e.ctx.command_path} -h` for help)" if e.ctx is not None else ""
        message = base.refused_value(e) or base.misplaced_option(e) or e.format_message()
        if base.wants_json(args):
            click.echo(base.json_text({"error": message, "kind": "UsageError"}))
        click.echo(f"Error: {message}{hint}", err=True)
        sys.exit(1)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except Exception as e:
        if not is_user_error(e):
            raise
        if base.wants_json(args) and not base.json_printed:
            click.echo(base.json_text({"error": str(e), "kind": type(e).__name__}))
        click.echo(base.error_line(e), err=True)
        sys.exit(base.INTERRUPTED if base.interrupted and isinstance(e, Cancelled) else 1)


def _writable_stdout() -> None:
    """Under a locale whose encoding cannot write every text (Latin-1, ASCII), a title or an
    answer's character it lacks is printed escaped (`\\u5c71`), as stderr already prints it,
    instead of ending the command in a traceback."""
    encoding = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "")
    if encoding != "utf8" and hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
