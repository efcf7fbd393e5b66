"""`kvdesk passages DOC [--query Q]`: a long document's passages, or what retrieval returns
for a question about it; a thin layer over `Engine.passages`."""

from __future__ import annotations

import click

from ..app import App
from ..passages import DEFAULT_K, DEFAULT_MODE, MODES
from .base import cli, emit, json_option, only_reading

PREVIEW_CHARS = 100


@cli.command()
@click.argument("doc_id", type=int)
@click.option("--query", "-q", help="A question: show the passages a chat reads for it, best "
              "first, with their scores, and the sentences its turn quotes from them.")
@click.option("-k", "k", type=click.IntRange(1, 100), default=DEFAULT_K, show_default=True,
              help="At most how many passages to retrieve (with --query).")
@click.option("--wide", is_flag=True, help="All k best (with --query), not only those a chat "
              "reads: for a question naming something rare, a chat reads the passages holding "
              "it.")
@click.option("--mode", type=click.Choice(MODES), help="How to rank (with --query; default: "
              f"{DEFAULT_MODE}, the best measured).")
@click.option("--chat", "chat_id", type=int, help="Retrieve as a follow-up in this chat (with "
              "--query): after its turns, which say what \"it\" is.")
@json_option
@click.pass_obj
def passages(app: App, doc_id: int, query: str | None, k: int, wide: bool, mode: str | None,
             chat_id: int | None, as_json: bool):
    """Show a long document's passages (where each is, its heading), or with --query those a
    chat reads for a question and the sentences of theirs its turn quotes."""
    only_reading(app)  # (a stored document: a mistyped --data-dir is not made)
    if query is None and (wide or mode is not None or k != DEFAULT_K or chat_id is not None):
        raise click.UsageError("-k, --wide, --mode and --chat say how to retrieve: give "
                               "--query too")
    hits = app.engine.passages(doc_id, query=query, k=k, mode=mode, wide=wide, chat_id=chat_id)
    lines = [f"#{h.index} [{h.location}]" + (f" {' > '.join(h.heading)}" if h.heading else "")
             + f" · {h.tokens} tokens" + (f" · score {h.score:.4f}" if query is not None else "")
             + "\n    " + " ".join(h.text.split())[:PREVIEW_CHARS] for h in hits]
    quoted = app.engine.evidence(doc_id, query, hits) if query is not None and hits else []
    lines += [f'quoted with the question: "{" ".join(q.split())}"' for q in quoted]
    if not hits:
        lines = [f"document {doc_id} fits the context: it is not kept as passages"
                 if query is None or not app.engine.passages(doc_id) else
                 "no passage matches the query"]
    emit([{**h.as_dict(), "location": h.location,
           **({"evidence": [q for q in quoted if q in h.text]}
              if query is not None else {})} for h in hits], as_json, lines)
