"""Hands the application over to the Qt GUI in `ui/`, or explains how to work headless.

The only module of desktop_app allowed to import `ui` (an import-linter exception), and only
inside `launch`, so that the core never needs Qt installed.
"""

from __future__ import annotations

import os
import sys

import click

from .app import App

HEADLESS_HELP = """\
No display found, so the kvdesk window cannot open here. Everything works headless too:

  kvdesk attach FILE...        attach documents (their KV cache is computed once, kept)
  kvdesk ask DOC_ID "..."      ask about a document (a new chat)
  kvdesk ask --chat ID "..."   continue a chat; kvdesk chats lists them
  kvdesk reopen CHAT_ID        restore a chat and say how long it took
  kvdesk --help                every command (.venv/bin/kvdesk from a checkout)

Set DISPLAY (X11) or WAYLAND_DISPLAY, or QT_QPA_PLATFORM=offscreen for a window nobody sees."""


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
        click.echo(f"The desktop window is not available in this installation ({e}).", err=True)
        click.echo(HEADLESS_HELP, err=True)
        return 1
    from .server import LocalAPI

    return run(app, App, serve=LocalAPI)
