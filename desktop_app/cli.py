"""The `kvdesk` command line: a thin click layer over `App`.

Every command accepts `--json` and then prints exactly one JSON document on stdout; progress
and logs go to stderr. Errors the user can act on (a missing model, a bad setting, a corrupt
cache) are printed as one clear line (or `{"error": ...}` with --json) and exit with status 1:
never a traceback.

No logic lives here that the GUI would need too: that belongs in `App` and the engine.
"""

from __future__ import annotations

import json
import sys

import click

from . import __version__
from .app import App
from .errors import USER_ERRORS
from .settings import load as load_settings

json_option = click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")


def emit(data: dict | list, as_json: bool, lines: list[str] | None = None) -> None:
    """Print `data` as JSON, or the human-readable `lines` (default: key: value)."""
    if as_json:
        click.echo(json.dumps(data, indent=2))
        return
    if lines is None:
        lines = [f"{k}: {v}" for k, v in data.items()] if isinstance(data, dict) else []
    for line in lines:
        click.echo(line)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kvdesk")
@click.option("--model", metavar="PATH", help="A GGUF model file (default: SmolLM2-135M, "
              "shipped with kvdesk; env KVDESK_MODEL).")
@click.option("--data-dir", metavar="DIR", help="Where documents, chats and caches live "
              "(env KVDESK_DATA_DIR; default: the platform's user data directory).")
@click.option("--n-ctx", type=int, help="Context size in tokens (default 8192).")
@click.pass_context
def cli(ctx: click.Context, model: str | None, data_dir: str | None, n_ctx: int | None):
    """kvdesk: ask a local model about long documents, without re-reading them every time."""
    settings = load_settings().with_overrides(model=model, data_dir=data_dir, n_ctx=n_ctx)
    app = App(settings)
    ctx.obj = app
    ctx.call_on_close(app.close)


@cli.command()
@json_option
@click.pass_obj
def info(app: App, as_json: bool):
    """Show the model, its KV layout and its cache fingerprint."""
    emit(app.info(), as_json)


@cli.command()
@click.pass_obj
def gui(app: App):
    """Open the desktop window (needs a display)."""
    from .launcher import launch

    sys.exit(launch(app))


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    try:
        cli.main(args=args, prog_name="kvdesk", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as e:
        e.show()
        sys.exit(e.exit_code)
    except USER_ERRORS as e:
        if "--json" in args:
            click.echo(json.dumps({"error": str(e), "kind": type(e).__name__}))
        click.echo(f"Error: {e}", err=True)
        sys.exit(1)
