"""Hands the application over to the Qt GUI in `ui/`, or explains how to work headless.

The only module of desktop_app allowed to import `ui` (an import-linter exception), and only
inside `launch`, so that the core never needs Qt installed.
"""

from __future__ import annotations

import os
import sys

import click

from .app import App
from .model.models import in_checkout

COMMANDS = """\
  kvdesk attach FILE...        attach documents (their KV cache is computed once, kept)
  kvdesk ask DOC_ID "..."      ask about a document (a new chat)
  kvdesk ask --chat ID "..."   continue a chat; kvdesk chats lists them
  kvdesk reopen CHAT_ID        restore a chat and say how long it took
  kvdesk --help                every command (.venv/bin/kvdesk from a checkout)"""

HEADLESS_HELP = f"""\
No display found, so the kvdesk window cannot open here. Everything works headless too:

{COMMANDS}

Set DISPLAY (X11) or WAYLAND_DISPLAY, or QT_QPA_PLATFORM=offscreen for a window nobody sees."""


def no_window_help(error: ImportError) -> str:
    """What to do where Qt is not installed (a display is there: its help would be wrong)."""
    how = ("`make venv` in the checkout installs it" if in_checkout() else
           f"install Qt for Python beside kvdesk: `pip install '{_gui_requirement()}'` (from a "
           "checkout: `pip install '.[gui]'`)")
    return (f"The desktop window is not available in this installation ({error}): {how}. "
            f"Everything works without it:\n\n{COMMANDS}")


def _gui_requirement() -> str:
    """The gui extra's Qt, as kvdesk's metadata pins it (pyproject's `gui`)."""
    from importlib import metadata

    try:
        wanted = metadata.requires("kvdesk") or []
    except metadata.PackageNotFoundError:
        wanted = []
    return next((r.split(";")[0].strip() for r in wanted if 'extra == "gui"' in r),
                "PySide6-Essentials")


def has_display() -> bool:
    if sys.platform in ("win32", "darwin"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
                or os.environ.get("QT_QPA_PLATFORM"))


def launch(app: App) -> int:
    if not has_display():
        click.echo(HEADLESS_HELP, err=True)
        return 0
    try:
        from ui.main import run
    except ImportError as e:
        click.echo(no_window_help(e), err=True)
        return 1
    from .server import LocalAPI

    return run(app, App, serve=LocalAPI)
