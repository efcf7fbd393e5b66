"""The listings: the documents attached and their caches (`docs`), the chats (`chats`).

Each reads only (`only_reading`: a first run or a mistyped --data-dir is listed as empty and
not made), through `App.engine`; what a status means is the engine's.
"""

from __future__ import annotations

import datetime
from dataclasses import replace

import click

from ..app import App
from ..formats.folders import one_line
from ..model.models import UnusableModelError
from ..results import STATUS_WORDS, CalibrationInfo, DocumentInfo, counted, size_text
from .base import cli, emit, json_option, only_reading, say


@cli.command()
@json_option
@click.pass_obj
def docs(app: App, as_json: bool):
    """List attached documents and their caches."""
    only_reading(app)
    rows, missing = listed_documents(app)
    # (not cached here: a question streams it from the shared cache when that holds it)
    hints = {"damaged": " (kvdesk verify)", "none": " (a question streams the shared cache's)"
             if any(d.status == "none" for d in rows) and app.engine.sharing.auto_pull else ""}
    words = {k: v + hints.get(k, "") for k, v in STATUS_WORDS.items()}
    pulled = any(d.status == "unfinished" for d in rows) and app.engine.sharing.tier
    words["unfinished"] = ("did not finish: attach the file " + "or run kvdesk remote pull "
                           * bool(pulled) + "again (kvdesk gc removes it)")  # (as commands)
    as_text = not missing and any(d.passages for d in rows) and app.engine.passages_as_text()
    at = level_words(app.engine.calibration() if any(d.levels for d in rows) else None)
    emit([d.as_dict() for d in rows], as_json, [
        f"[{d.doc_id}] {one_line(d.title)}" + (f" (a folder of {counted(d.files, 'file')})"
                                     if d.files else "") + f" — {counted(d.tokens, 'token')}"
        + (f" ({d.kept_tokens:,} kept)" if d.status == "ready" and d.kept_tokens < d.tokens
           else "")
        + (f", {d.passages:,} passages ({d.passages_cached:,} with their KV"
           + ("; read as text until this model is calibrated: kvdesk calibrate" if as_text
              else "") + ")" if d.passages else "")
        + ("" if d.status == "passages" else f", {words.get(d.status, d.status)}")
        # (none under this model: its status says so, or "unknown" says why none can be named)
        + (f", {sum(d.cache_bytes.values()) / 1e6:.1f} MB cached" if d.cache_bytes
           and d.status != "unknown" else "") + (at[d.levels] if d.levels else "")
        + (f", {d.damaged_chunks} damaged chunks (kvdesk verify --repair)"
           if d.damaged_chunks else "")
        + (f" ({d.changed_words}" + (
            f"; document {d.newer} holds the new text)" if d.newer is not None else ")")
           if d.file_changed else "") for d in rows] or ["no documents yet: kvdesk attach FILE"])
    store = app.engine.store
    if not as_json and rows:
        from ..kv.evictions import budget_room, storage_line  # (imported with the store)

        click.echo(storage_line(store, "" if missing else app.engine.fingerprint))
        if room := budget_room(store):
            say([room])
    if not as_json and any(d.passages_cached < d.passages for d in rows) and \
            store.usage_bytes() >= 0.98 * store.budget_bytes:
        say([f"the storage budget ({size_text(store.budget_bytes)}) is full: no more passages "
             "are given their KV ahead of need, and a passage without it gets it when a "
             "question reads it (a larger setting storage_budget_gb gives them all theirs)"])


def level_words(cal: CalibrationInfo | None) -> dict[str, str]:
    """What `docs` says of each `DocumentInfo.levels` after its size, the model calibrated
    (`cal`) or not."""
    since = cal and datetime.date.fromtimestamp(cal.created).isoformat()
    return {"calibrated": " at calibrated levels",
            # (moved by a calibration; a calibration stopped partway, or made by another
            # process, leaves some for the next start or `kvdesk calibrate`)
            "model-independent": " at model-independent levels " + (
                f"(calibrated ones since {since}: kvdesk calibrate moves it to them)" if cal
                else "until this model is calibrated (kvdesk calibrate)"),
            "lossless-until-calibrated": ", lossless only until this model is calibrated "
                                         "(kvdesk calibrate)",
            "lossless": ", lossless only"}


def listed_documents(app: App) -> tuple[list[DocumentInfo], Exception | None]:
    """The documents and their caches under the model; where it is not found (and not loaded)
    each one cached under some model has its status "unknown", said, and the error."""
    if (missing := app.model_missing) is None:
        return app.engine.documents(), None
    why = "cannot be used" if isinstance(missing, UnusableModelError) else "is not found"
    say([f"the model {why}, so which documents are cached for it is unknown: {missing}"])
    return [replace(d, status="unknown") if d.status == "stale" else d
            for d in app.engine.library.documents("")], missing


@cli.command()
@click.option("--search", metavar="TEXT", help="Only the chats whose title or messages hold "
              "TEXT (any case), each with the words around it.")
@click.option("--limit", type=click.IntRange(min=1), help="At most this many, the most recent.")
@json_option
@click.pass_obj
def chats(app: App, search: str | None, limit: int | None, as_json: bool):
    """List chats, most recent first."""
    if search is not None and not search.strip():
        raise click.BadParameter("give the words to look for", param_hint="'--search'")
    only_reading(app)
    rows = app.engine.chats()
    found = app.engine.search_chats(search) if search else None
    if found is not None:
        rows = [c for c in rows if c.chat_id in found]
    more = len(rows) - limit if limit is not None and len(rows) > limit else 0
    rows = rows[:limit]
    emit([{**c.as_dict(), **({"found": found[c.chat_id]} if found is not None else {})}
          for c in rows], as_json, [
        f"[{c.chat_id}] {one_line(c.title)} — {counted(c.messages, 'message')}"
        + (" · blended (approximate until its exact context is stored)"
           if c.kv_mode == "blended" else "")
        + (f"\n    “{found[c.chat_id]}”" if found and found[c.chat_id] else "") for c in rows]
        + ([f"and {counted(more, 'earlier chat')} (--limit)"] if more else [])
        or [f"no chat holds “{search.strip()}”" if found is not None
            else "no chats yet: kvdesk ask --doc ID QUESTION"])
