"""What every `kvdesk` command shares: the group and its options, JSON or text output,
progress on stderr, Ctrl-C as a cancel, and the notes a command passes on to the user.

No logic lives here that the GUI would need too: that belongs in `App` and the engine.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import click
import pydantic

from .. import __version__
from ..app import App
from ..errors import is_user_error
from ..formats.folders import one_line
from ..results import Progress, levels_summary
from ..settings import load as load_settings
from ..validation import InvalidValue, parse
from . import process
from .process import INTERRUPTED, wants_json  # noqa: F401 - the commands' names for them

T = TypeVar("T")
M = TypeVar("M", bound=pydantic.BaseModel)

running: App | None = None  # this process's App, once the group has made it


def error_line(e: Exception, short: str = "this command cannot run here, for the reason "
               "warned of above") -> str:
    """The `Error:` line for a user error: `short` where a warning above already said it all
    (a damaged store is warned of as the command opens it)."""
    if running is not None and str(e) in running.warned:
        return f"Error: {short}"
    return f"Error: {e}"


json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")


def option_name(field: str) -> str:
    """The command-line spelling of a value's field: budget_ms -> --budget-ms."""
    return "--" + field.replace("_", "-")


def checked(build: Callable[..., T], *, flags: dict[str, str] | None = None, **values) -> T:
    """build(**values), its InvalidValue named as the user typed it (--budget-ms, not budget_ms;
    `flags`: a value's option where it is not named after it, {"server_port": "--port"})."""
    try:
        return build(**values)
    except InvalidValue as e:
        raise InvalidValue((flags or {}).get(e.key) or option_name(e.key), e.reason) from None


def values(model: type[M], **given) -> M:
    """The command line's values for `model` (options not given keep their defaults)."""
    return checked(lambda **v: parse(model, v),
                   **{k: v for k, v in given.items() if v is not None})


# What a flag of each click type should be, in the words a setting's value is refused in
# (validation.problem): "--budget-ms: should be a number", not click's "is not a valid float".
_SHOULD_BE = {click.types.IntParamType: "should be an integer",
              click.types.FloatParamType: "should be a number"}


def refused_value(e: click.UsageError) -> str | None:
    """A flag's or argument's value click refused for its type (an integer, a number, one of
    some choices), told as every other refused value is: `--n-ctx: should be an integer (got
    "big")`; None for any other usage error, or a message of click's not read here."""
    param = getattr(e, "param", None)
    given = re.match(r"(.+?) is not ", getattr(e, "message", ""))
    if not isinstance(e, click.BadParameter) or param is None or given is None:
        return None
    try:
        value = ast.literal_eval(given.group(1))  # (click writes the value as Python's repr)
    except (ValueError, SyntaxError):
        return None
    kind = type(param.type)
    if isinstance(param.type, click.Choice):
        *most, last = [str(c) for c in param.type.choices]
        should = f"should be {', '.join(most)} or {last}" if most else f"should be {last}"
    elif kind in _SHOULD_BE:
        should = _SHOULD_BE[kind]
    else:
        return None
    return f"{param.get_error_hint(e.ctx).replace(chr(39), '')}: {should} (got {json.dumps(value)})"


def misplaced_option(e: click.UsageError) -> str | None:
    """An option of `kvdesk` itself (`--data-dir`, `--model`) given after a command, said
    where it goes: `kvdesk --data-dir DIR verify`, not click's "No such option"; None for any
    other usage error."""
    if not isinstance(e, click.NoSuchOption) or e.ctx is None or e.ctx.parent is None:
        return None
    root = e.ctx.find_root()
    if not any(e.option_name in p.opts for p in root.command.params):
        return None
    command = e.ctx.command_path.removeprefix(f"{root.info_name} ")
    return (f"{e.option_name} is an option of kvdesk itself: it goes before the command "
            f"(`kvdesk {e.option_name} ... {command} ...`)")


json_printed = False  # whether the command printed its one JSON document (`print_json`)


def json_text(data: dict | list, **options) -> str:
    """`data` as JSON with its text as written ("契約書", not "\\u5951..."), where stdout
    takes UTF-8; escaped where it would not (a file redirected under a legacy code page), or
    where the text holds what UTF-8 cannot write (a file name's bytes that are not UTF-8)."""
    utf8 = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "") == "utf8"
    if utf8:
        written = json.dumps(data, ensure_ascii=False, **options)
        with contextlib.suppress(UnicodeEncodeError):
            written.encode("utf-8")
            return written
    return json.dumps(data, **options)


def print_json(data: dict | list) -> None:
    """Print the command's one JSON document: an error after it (a second Ctrl-C while it
    finishes) is said on stderr only, so stdout still holds exactly one."""
    global json_printed
    click.echo(json_text(data, indent=2))
    json_printed = True


def emit(data: dict | list, as_json: bool, lines: list[str] | None = None) -> None:
    """Print `data` as JSON, or the human-readable `lines` (default: key: value)."""
    if as_json:
        print_json(data)
        return
    if lines is None:
        lines = [f"{k}: {v}" for k, v in data.items()] if isinstance(data, dict) else []
    for line in lines:
        click.echo(line)


HELP = ("-h", "--help")


class Kvdesk(click.Group):
    """The root group, keeping its command line: a command's help needs no settings, and a
    bad one must not hide how to use the command that would fix it."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["kvdesk.argv"] = list(args)
        return super().parse_args(ctx, args)


class Unsettled:
    """The App of a command line asking for help while a setting is refused: what would read
    it (an option's value written "-h", taken for help) is refused for that setting."""

    def __init__(self, error: Exception):
        self.error = error

    def __getattr__(self, name: str):
        raise self.error


def asks_help(args: list[str]) -> bool:
    """Whether a command line asks for help (-h or --help before any `--`)."""
    before = args[:args.index("--")] if "--" in args else args
    return any(a in HELP for a in before)


@click.group(cls=Kvdesk, context_settings={"help_option_names": list(HELP)})
@click.version_option(__version__, prog_name="kvdesk")
@click.option("--model", metavar="PATH|NAME", help="A GGUF model file, or the name of one "
              "`kvdesk models` lists, e.g. llama3.2:3b (default: SmolLM2-135M, shipped with "
              "kvdesk; env KVDESK_MODEL).")
@click.option("--data-dir", metavar="DIR", help="Where documents, chats and caches live "
              "(env KVDESK_DATA_DIR; default: the platform's user data directory).")
@click.option("--n-ctx", type=int, help="Context size in tokens (default: the model's "
              "trained context, capped by the memory it needs; kvdesk info says which).")
@click.pass_context
def cli(ctx: click.Context, model: str | None, data_dir: str | None, n_ctx: int | None):
    """kvdesk: ask a local model about long documents, without re-reading them every time."""
    # (a folder typed on the command line is where the shell is, as any command's is)
    data_dir = str(Path(data_dir).expanduser().absolute()) if data_dir else data_dir
    try:
        settings = checked(load_settings().with_overrides, model=model, data_dir=data_dir,
                           n_ctx=n_ctx)
    except Exception as e:
        if not (is_user_error(e) and asks_help(ctx.meta.get("kvdesk.argv", []))):
            raise
        ctx.obj = Unsettled(e)  # (help is printed before a command reads it)
        return
    # Work that goes on after a call returns (an exact context, passages' KV) only where
    # kvdesk keeps running: a one-shot command would cancel it at exit.
    global running
    background = ctx.invoked_subcommand in ("serve", "gui")
    app = running = App(settings, background=background, model_flag=bool(model))
    ctx.obj = app
    ctx.call_on_close(app.close)
    if not background and not app.holds_store:
        was = _folder(app.data_dir)
        ctx.call_on_close(lambda: _say_made(app, was))


def _say_made(app: App, folder: bool) -> None:
    """A store this one-shot command made (a first attach or ask; in a `folder` that was
    there, or not): where it is, once."""
    if app.holds_store:
        say([("kvdesk made its store in" if folder else "kvdesk made its data directory,")
             + f" {app.data_dir}: it keeps your documents' text, chats and caches there "
             "(`kvdesk info` names it; --data-dir or KVDESK_DATA_DIR moves it)"])


# A chat's turn or a file's attach held by another process (`turns.waited`): no percentage.
WAITING = "waiting for another kvdesk process to finish its turn here (Ctrl-C stops waiting)"


def redraws() -> bool:
    """Whether stderr is a terminal that redraws a line in place (`\\r`, then erase to its
    end); a dumb one (TERM=dumb: Emacs' shell, some CI logs) gets lines, as a file does."""
    return sys.stderr.isatty() and os.environ.get("TERM") != "dumb"


class TerminalProgress:
    """A one-line progress display on stderr, redrawn in place on a terminal."""

    def __init__(self):
        self.tty = redraws()
        self.last = None
        self.noted: list[str] = []  # the notes said, each once, as soon as they came

    def __call__(self, p: Progress) -> None:
        self.notes(p)
        pct = 100 * p.done // max(1, p.total)
        # (no total yet: a folder's files still being found, their count so far)
        key = (p.title, p.phase, pct if self.tty else pct // 25) if p.total else (
            p.title, p.phase, p.done if self.tty else None)
        if key == self.last:
            return
        self.last = key
        line = f"{one_line(p.title) + ': ' if p.title else ''}" + (
            WAITING if p.phase == "wait" else f"{p.phase} {pct:3d}% ({p.done:,}/{p.total:,})"
            if p.total else f"{p.phase}: {p.done:,} found so far")
        if self.tty:
            click.echo(f"\r\033[K{line}", nl=False, err=True)
        else:
            click.echo(line, err=True)

    def notes(self, p: Progress) -> None:
        """Say `p`'s note, once (all a server's background work shows of its progress)."""
        if p.note and p.note not in self.noted:
            self.noted.append(p.note)
            click.echo(("\r\033[K" if self.tty else "") + f"Note: {p.note}", err=True)
            self.last = None

    def done(self) -> None:
        if self.tty and self.last is not None:
            click.echo("\r\033[K", nl=False, err=True)
        self.last = None


interrupted = False  # whether Ctrl-C (or SIGTERM) stopped this command's work (`main` reads it)
kept: str | None = None  # what the command stored, said where its output fails (`main`)


def stopper() -> str:
    """What stopped the work, as a note names it: Ctrl-C, or SIGTERM (`timeout`, systemd)."""
    return "SIGTERM" if process.terminated() else "Ctrl-C"


@contextlib.contextmanager
def interruptible():
    """Ctrl-C sets a cancel event the engine checks between slices, so it stops cleanly (and
    SIGTERM does, through it, in a process `run` started)."""
    cancel = threading.Event()

    def on_sigint(signum, frame):
        global interrupted
        if cancel.is_set():  # a second Ctrl-C: the user really means it
            raise KeyboardInterrupt
        click.echo("\nStopping...", err=True)
        interrupted = True
        cancel.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield cancel
    finally:
        signal.signal(signal.SIGINT, previous)


def stopped(said: str, as_json: bool) -> None:
    """Exit after Ctrl-C stopped the work: `said` on stderr, and with --json one JSON
    document too (as every refusal prints one). (After SIGTERM `run` makes the status 143.)"""
    if as_json:
        print_json({"error": said, "kind": "Cancelled"})
    click.echo(said[0].upper() + said[1:] + ".", err=True)
    sys.exit(INTERRUPTED)


def level_list(ctx: click.Context, param: click.Parameter, value: str | None
               ) -> list[str] | None:
    """A comma-separated option's names, checked as the command line is read (None: not
    given); given empty, refused."""
    if value is None:
        return None
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise click.BadParameter("names no level (leave the option out for the default)")
    return names


def only_reading(app, said: bool = True) -> None:
    """A command that only reads: where the data directory does not exist or holds no store
    (a first run, a mistyped --data-dir) it is read as empty, said (unless the command's own
    answer says it: `said=False`), and not written to."""
    app.reads_only = True
    if not app.holds_store:
        app.check_drive()  # (a drive unplugged is not "nothing stored yet")
    if said and not app.holds_store:  # (a folder that exists: only the store is missing)
        say([f"no kvdesk data in {app.data_dir} yet: nothing is stored there"
             if _folder(app.data_dir) else
             f"no data directory at {app.data_dir} yet: nothing is stored there"])


def _folder(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError:
        return False


def say(messages: list[str]) -> None:
    """Each message on a line of its own; on a terminal, over any progress line drawn there
    (a pull's retry note once ran on after "pull  40% (12/30)")."""
    clear = "\r\033[K" if redraws() else ""
    for m in messages:
        click.echo(f"{clear}Note: {m}", err=True)


# (`make venv` and the bundle compile them ahead; a pip install, or a checkout whose codec
# changed, compiles them at its first attach: 40 s and more on a busy machine, said)
COMPILING = ("readying the codec's kernels first: where they were not compiled ahead, this "
             "compiles them (once, about 30 s to a minute)")


def say_compiling(app: App) -> None:
    """Say that a command will wait for the codec's kernels, where no stamp shows them
    compiled for the levels it stores (`jitcache.kernels_cached`, a file's read)."""
    from codec.jit import jitcache

    if not jitcache.kernels_cached(list(app.engine.levels)):
        say([COMPILING])


def summary(levels: list[str]) -> str:
    return levels_summary(levels) if levels else "nothing to restore"


no_server_option = click.option("--no-server", is_flag=True, help="Work in this process even "
                                "when a kvdesk server runs on the data directory.")


def server_client(app: App, no_server: bool):
    """A client of the kvdesk server running on this data directory, model and context, if
    there is one (and the user did not say --no-server): it answers without loading anything.
    `say_served` tells the user once the server has answered (a refusal says only why)."""
    if no_server:
        return None
    from ..server import discovery

    found = discovery.find(app.data_dir, model=app.model_path, n_ctx=app.settings.n_ctx)
    if found is None:
        return None
    from ..server.client import Client

    return Client(*found)


def say_served(client) -> None:
    if client is not None:
        say([f"answered by the kvdesk server at {client.url} (--no-server: in this process)"])
