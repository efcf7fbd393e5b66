"""`kvdesk serve`: the local OpenAI-compatible API (desktop_app.server), in the foreground."""

from __future__ import annotations

import logging
import threading

import click

from ..app import App
from ..passagepass import LOGGER
from .base import TerminalProgress, checked, cli

OFF = "none"  # --ollama-port none: Ollama's port not served


def _port_or_off(value: str | None) -> int | str | None:
    """--ollama-port's value: a port, `none` (not served), or None (not given)."""
    if value is None:
        return None
    if value.strip().lower() == OFF:
        return OFF
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is neither a port nor none") from None


@cli.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; anything but loopback needs --api-key.")
@click.option("--port", type=int, help="Port (default: the setting server_port, 8765; 0: any "
              "free port).")
@click.option("--api-key", envvar="KVDESK_API_KEY", help="A key every client must send "
              "(Authorization: Bearer KEY); env KVDESK_API_KEY.")
@click.option("--ollama-port", callback=lambda ctx, param, value: _port_or_off(value),
              help="Also serve on this port when it is free, where Ollama's clients look "
              "(default: the setting ollama_port, 11434; none: not).")
@click.pass_obj
def serve(app: App, host: str, port: int | None, api_key: str | None,
          ollama_port: int | str | None):
    """Serve the local API: OpenAI's chat and text completions and Ollama's API, with a
    prompt cache that survives restarts, and kvdesk's own documents and chats. Ctrl-C stops
    it."""
    from ..server import Server

    if port is not None:
        checked(app.settings.with_values, flags={"server_port": "--port"}, server_port=port)
    if ollama_port == OFF:
        ollama_port = None
    elif ollama_port is None:
        ollama_port = app.settings.ollama_port
    else:
        checked(app.settings.with_values, ollama_port=ollama_port)
    server = Server(app, host=host, port=app.settings.server_port if port is None else port,
                    api_key=api_key, ollama_port=ollama_port)
    say_the_passage_pass()
    with server.signals_stop():  # (a stop while the model loads: "Stopped.", never lost)
        server.listen()  # (a served directory or a busy port refused at once, not loading)
        click.echo(f"Loading {app.model_path.name}...", err=True)
        serve_until_stopped(app, server)
    click.echo("Stopped.", err=True)


class _Said(logging.Handler):
    """A log line said on stderr, as the server's own lines are (the stderr of the moment)."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(self.format(record), err=True)


def say_the_passage_pass() -> None:
    """The background passage pass's lines from info on: when it starts over a document
    (its passages, the disk they take, the budget it stops at), how far it is at most once a
    minute, and when it ends or stops; without this, only its warnings were printed."""
    passes = logging.getLogger(LOGGER)
    passes.setLevel(logging.INFO)
    passes.propagate = False  # (a library that configures the root logger would say it twice)
    if not any(isinstance(h, _Said) for h in passes.handlers):  # (once per process)
        passes.addHandler(_Said())


def serve_until_stopped(app: App, server) -> None:
    """Run the server, saying when it serves, and calibrate beside it if the model needs."""

    def announce() -> None:
        server.started.wait()
        click.echo(f"kvdesk serves {server.url}/v1 (OpenAI-compatible; model ids "
                   f"{app.model_path.stem!r} and 'default') and Ollama's API at "
                   f"{server.ollama_url or server.url}; Ctrl-C stops it", err=True)

    threading.Thread(target=announce, daemon=True).start()
    stop_calibrating = threading.Event()
    calibrating = threading.Thread(target=calibrate_in_background,
                                   args=(app, server, stop_calibrating), daemon=True)
    calibrating.start()
    try:
        server.run()
    finally:
        stop_calibrating.set()
        calibrating.join(30)


def calibrate_in_background(app: App, server, cancel: threading.Event) -> None:
    """Once the server serves: calibrate the codec for the model if it is not yet (and the
    setting calibrate_automatically is on), saying so on stderr; answers keep being served
    meanwhile, with the model-independent levels until it is done. A calibrated model's
    caches stored before its calibration are moved to its levels (`Engine.relevel`)."""
    from ..errors import Cancelled

    while not server.started.wait(0.1):  # (a server that never starts: stop waiting)
        if cancel.is_set():
            return
    if cancel.is_set() or not app.settings.calibrate_automatically:
        return
    engine = app.engine
    if engine.calibration() is not None:  # what a calibration stopped partway left, if any
        moved = engine.relevel(cancel=cancel)
        if moved["entries"]:
            click.echo(f"{moved['entries']} cache(s) stored before this model's calibration "
                       "moved to its levels.", err=True)
        return
    click.echo("Calibrating the codec for this model in the background (minutes, once; "
               "`calibrate_automatically` in the settings turns this off)...", err=True)
    try:
        cal = engine.calibrate(cancel=cancel, progress=TerminalProgress().notes)
    except Cancelled:
        return
    except Exception as e:  # noqa: BLE001 - the server keeps serving with the default levels
        click.echo(f"Warning: calibrating the codec failed ({e}); new caches keep the "
                   "model-independent levels", err=True)
        return
    click.echo(f"Codec calibrated ({cal.id[:12]}): new caches use this model's own levels.",
               err=True)
