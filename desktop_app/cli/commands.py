"""The command line as a whole: every command registered, and `main`, which runs one and turns
what ends it into what README promises a user and a script: a usage error, a user error, a
Ctrl-C or an output that failed, each as one line on stderr (and with --json one document on
stdout, where stdout still takes one) and its exit status; never a traceback but for a bug.

It never ends a process itself (`sys.exit` only: `process.run` ends the process).
"""

from __future__ import annotations

import sys

import click

from ..errors import Cancelled, is_user_error, out_of_memory
from . import base, chat, listings, maintenance, passages, remote, serve  # noqa: F401 - each registers its commands
from .base import cli
from .streams import OutputFailed

__all__ = ["cli", "main"]


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    _writable_stdout()
    base.json_printed = False
    base.running = None
    base.interrupted = False
    base.kept = None
    try:
        _main(args)
    except OutputFailed as e:  # (said here: a refusal's own output may be what failed)
        if line := e.error_line():
            click.echo(line, err=True)
        if base.kept:  # what the command stored all the same, and where a script finds it
            base.say([base.kept])
        sys.exit(e.status)


def _main(args: list[str]) -> None:
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
    except MemoryError as e:  # (a memory limit, `ulimit -v` or a full machine, mid-work)
        message = out_of_memory(e)
        if base.wants_json(args) and not base.json_printed:
            click.echo(base.json_text({"error": message, "kind": "MemoryError"}))
        click.echo(f"Error: {message}", err=True)
        sys.exit(1)
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
