"""`python -m desktop_app` is the `kvdesk` command."""

from .cli import run

run()
