"""The everyday commands: attach documents, ask about them, reopen chats, list and delete.

Each is a thin layer over `App.engine`; what a flow does is the engine's.
"""

from __future__ import annotations

import os
import sys

import click

from ..app import App
from ..errors import Cancelled, ChatFullError, is_user_error
from ..formats.folders import one_line
from ..results import (
    PASSAGES_AS_TEXT,
    SERVER_STOPPED,
    AttachFailure,
    Source,
    counted,
    restore_phrase,
    size_text,
)
from . import base
from .answers import answer_notes, finish_exact
from .base import (
    INTERRUPTED,
    TerminalProgress,
    cli,
    emit,
    error_line,
    interruptible,
    json_option,
    level_list,
    no_server_option,
    only_reading,
    print_json,
    say,
    say_compiling,
    say_served,
    server_client,
    stopped,
    summary,
)
from .flags import generation_options, known_levels, restore_options
from .streams import OutputFailed


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path())
@click.option("--levels", callback=level_list,
              help="Comma-separated codec levels to store (default: every level).")
@no_server_option
@json_option
@click.pass_obj
def attach(app: App, files: tuple[str, ...], levels: list[str] | None, no_server: bool,
           as_json: bool):
    """Attach documents: extract, prefill once, compress and store their KV cache."""
    if levels is not None:
        known_levels("--levels", levels)
    results, failed, attached, kept = [], False, 0, []
    bar = TerminalProgress()
    client = server_client(app, no_server)
    engine = client or app.engine
    if client is None:
        say_compiling(app)
    with interruptible() as cancel:
        for path in files:
            try:
                res = engine.attach(path, levels=levels, progress=bar,
                                    cancel=cancel)
            except Cancelled:
                bar.done()
                click.echo(f"{path}: cancelled; nothing was stored", err=True)
                results.append(AttachFailure(path, "cancelled; nothing was stored").as_dict())
                failed = True
                break
            except Exception as e:
                if not is_user_error(e):
                    raise
                bar.done()
                click.echo(error_line(e), err=True)
                results.append(AttachFailure(path, str(e)).as_dict())
                failed = True
                continue
            bar.done()
            if not attached:
                say_served(client)
            attached += 1
            kept.append(res.doc_id)  # (said if the output fails: a script learns its ids)
            base.kept = (f"document {kept[0]} is attached all the same (`kvdesk docs` lists "
                         "it)" if len(kept) == 1 else f"documents {', '.join(map(str, kept))} "
                         "are attached all the same (`kvdesk docs` lists them)")
            for w in res.warnings:
                if w not in bar.noted:
                    click.echo(f"Warning: {w}", err=True)
            results.append(res.as_dict())
            title = one_line(res.title)  # (a file holding a document's text again adds none)
            name = one_line(os.path.basename(os.path.abspath(path)))  # ("." and "src/" too)
            if res.reused and name != title:
                title += f" (the same text as {name})"
            if not as_json and res.passages:
                click.echo(f"[{res.doc_id}] {title}: {res.tokens:,} tokens as "
                           f"{res.passages:,} passages ("
                           + ("already kept" if res.reused else f"indexed in {res.encode_s:.1f} s")
                           + "); `kvdesk passages` shows what a question retrieves; "
                           + ("the server computes their KV in the background" if client else
                              f"{PASSAGES_AS_TEXT} (`kvdesk calibrate`, a few minutes "
                              "once; the window and `kvdesk serve` calibrate by themselves "
                              "after an attach)" if app.engine.passages_as_text() else
                              "a passage's KV is computed when a question first reads it (the "
                              "window and `kvdesk serve` compute them all in the background)"))
            elif not as_json:
                sizes = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in res.stored_bytes.items()
                                  ) if any(res.stored_bytes.values()) else "not stored"
                how = "already cached" if res.reused else (
                    f"from the shared cache in {res.encode_s:.1f} s" if res.pulled else
                    f"prefill {res.prefill_s:.1f} s, encode {res.encode_s:.1f} s")
                how += "; shared" if res.pushed else ""
                click.echo(f"[{res.doc_id}] {title}: {counted(res.kept_tokens, 'token')} ({how}); "
                           f"raw {res.raw_bytes / 1e6:.1f} MB -> {sizes}")
    if results and not as_json:
        # (a document kept as passages encodes nothing when it is attached, nor does one
        # whose cache the storage budget does not hold: its calibration is not known then)
        codecs = {r.get("calibration") for r in results if "doc_id" in r and not r["passages"]
                  and any(r["stored_bytes"].values())}
        if codecs:
            click.echo(codec_line(codecs))
    if as_json:
        print_json(results)
    if failed:
        sys.exit(INTERRUPTED if cancel.is_set() else 1)


def codec_line(calibrations: set[str | None]) -> str:
    """Which codec levels an attach's caches were encoded with."""
    calibrated = sorted(c[:12] for c in calibrations if c)
    line = f"codec: calibrated for this model ({', '.join(calibrated)})" if calibrated else ""
    if None in calibrations:
        line += "; " if line else "codec: "
        line += ("model-independent levels (this model is not calibrated yet: "
                 "`kvdesk calibrate`, a few minutes once)")
    return line


@cli.command(context_settings={"ignore_unknown_options": False})
@click.argument("args", nargs=-1, required=True, metavar="[DOC_ID] QUESTION")
@click.option("--chat", "chat_id", type=int, help="Continue this chat instead of a new one.")
@click.option("--doc", "docs", type=int, multiple=True, help="A document of a new chat; "
              "repeat it for a chat over several (their caches are blended).")
@restore_options
@generation_options
@no_server_option
@json_option
@click.pass_obj
def ask(app: App, args, chat_id, docs, restore, generation, no_server, as_json):
    """Ask about a document (a new chat; --doc ID --doc ID for several), or continue a chat
    with --chat.

    Generation flags not given come from the settings file, else the model file's
    recommendation, else kvdesk's defaults (`kvdesk info` lists them). For the same answer
    every time, give a --seed, or --temperature 0 (greedy, penalties kept).
    """
    if chat_id is not None and len(args) == 1 and not docs:
        doc_ids, question = [], args[0]
    elif chat_id is None and len(args) == 2 and args[0].isdigit() and not docs:
        doc_ids, question = [int(args[0])], args[1]
    elif chat_id is None and len(args) == 1 and docs:
        doc_ids, question = list(docs), args[0]
    else:
        # (two words, the first not a number: a document's title or a mistyped id given)
        wrong = (f"{args[0]!r} is not a document id (`kvdesk docs` lists them); "
                 if chat_id is None and len(args) == 2 and not docs else "")
        raise click.UsageError(f"{wrong}usage: kvdesk ask DOC_ID QUESTION, kvdesk ask --doc "
                               "ID --doc ID QUESTION, or kvdesk ask --chat CHAT_ID QUESTION "
                               "(quote the question)")
    if chat_id is not None or doc_ids:  # (stored ones: a mistyped --data-dir is not made)
        only_reading(app)
    bar = TerminalProgress()
    started = []
    lost: list[OutputFailed] = []  # stdout's failure: the answer is stopped as Ctrl-C stops it

    def on_token(text: str) -> None:
        if not started:  # the engine streams an answer from its first visible character
            started.append(True)
            if not as_json:
                bar.done()
        if as_json or lost:
            return
        try:
            click.echo(text, nl=False)
        except OutputFailed as e:  # (`| head -1` read enough; a full disk: none of it is read)
            lost.append(e)
            cancel.set()

    said: list[str] = []

    def on_restore(report) -> None:  # said before the answer streams: why it may be slow
        say_served(client)
        say(report.messages)
        said.extend(report.messages)

    client = server_client(app, no_server)
    if client is None:
        app.preload()  # the model loads while the engine's modules import
    with interruptible() as cancel:
        try:
            res = (client or app.engine).ask(
                question, chat_id=chat_id, doc_ids=doc_ids, restore=restore,
                generation=generation, on_token=on_token, on_restore=on_restore, progress=bar,
                cancel=cancel)
        except Cancelled:  # Ctrl-C before the answer's first word, wherever the work was
            if lost:
                raise lost[0] from None
            if not cancel.is_set():
                raise
            bar.done()
            stopped("stopped before the answer began: nothing of this turn is stored", as_json)
        except ChatFullError as e:  # (the command that goes on, named: `ask` takes documents)
            raise ChatFullError(f"{e}: `kvdesk ask {' '.join(f'--doc {d}' for d in e.doc_ids)} "
                                "QUESTION`" if e.doc_ids else str(e), e.doc_ids) from None
        except Exception:
            if started and not as_json:  # the error's line starts below the streamed words
                click.echo()
            raise
    if res.stored:
        so_far = "so far " if cancel.is_set() else ""
        base.kept = (f"the answer {so_far}is kept, in chat {res.chat_id} (`kvdesk export "
                     f"{res.chat_id}` prints it)")
    if lost:
        raise lost[0]
    if not started and not as_json:
        bar.done()  # (an answer of no visible character never cleared it)
    if not as_json:
        click.echo()
    # The command's own notes, said as the engine's are and carried in --json's messages
    # beside them: a script reads there what the user reads on stderr.
    ours = answer_notes(res, stopped=cancel.is_set(), one_shot=client is None)
    say([m for m in res.messages if m not in said] + ours)
    # (the Ctrl-C that stopped it skips it, and a turn not stored has no chat to make exact)
    exact = client is None and not cancel.is_set() and res.stored
    if as_json:  # (its notes, what it evicted too, in messages: a script reads them there)
        try:
            ours += finish_exact(app, res.chat_id, res.blended) if exact else []
        finally:  # (a second Ctrl-C during it ends the process: the answer is printed first)
            print_json({**res.as_dict(), "messages": [*res.messages, *ours]})
    else:
        # (`kvdesk passages` shows them)
        titles = app.store.document_titles() if res.sources else None
        for line in Source.read(res.sources, res.evidence, titles, res.read_whole):
            click.echo(one_line(line), err=True)  # (a title's line break: escaped)
        chat = f"chat {res.chat_id}" if res.stored else "not stored"
        click.echo(f"[{chat}] first token after {res.ttft_s * 1000:.0f} ms "
                   f"(restore {res.restore_s * 1000:.0f} ms, {summary(res.chunk_levels)})",
                   err=True)
        if exact:
            finish_exact(app, res.chat_id, res.blended)
    if res.finish_reason == SERVER_STOPPED and not cancel.is_set():  # (its note says so)
        sys.exit(1)  # a script keeps no answer the server's stop cut short as a whole one


@cli.command()
@click.argument("chat_id", type=int)
@restore_options
@no_server_option
@json_option
@click.pass_obj
def reopen(app: App, chat_id, restore, no_server, as_json):
    """Restore a chat's context into the model and report how."""
    only_reading(app)  # (a stored chat: a mistyped --data-dir is not made)
    bar = TerminalProgress()
    client = server_client(app, no_server)
    if client is None:
        app.preload()  # the model loads while the engine's modules import
    with interruptible() as cancel:
        rep = (client or app.engine).reopen(chat_id, restore=restore, progress=bar,
                                            cancel=cancel)
    bar.done()
    say_served(client)
    say(rep.messages)
    out = {"chat_id": chat_id, "tokens": rep.tokens, "restore_s": round(rep.restore_s, 4),
           "chunk_levels": rep.chunk_levels, "recomputed_tokens": rep.recomputed_tokens,
           "recompute_s": round(rep.recompute_s, 4), "messages": rep.messages}
    if as_json and client is None:  # (as `ask --json`: its notes in the one object)
        try:
            out["messages"] = [*rep.messages, *finish_exact(app, chat_id, rep.blended)]
        finally:
            emit(out, as_json, [])
        return
    emit(out, as_json, [restore_phrase(rep)])
    if client is None:
        finish_exact(app, chat_id, rep.blended)


@cli.command()
@click.argument("chat_id", type=int)
@click.option("--format", "fmt", type=click.Choice(["markdown", "json"]), default="markdown",
              show_default=True, help="Markdown (each answer's sources and quotes under it) "
              "or JSON (the messages with their stats).")
@click.option("--json", "as_json", is_flag=True, help="The same as --format json.")
@click.pass_obj
def export(app: App, chat_id: int, fmt: str, as_json: bool):
    """Print a chat, to save or share it (as the window's chat list exports it)."""
    only_reading(app)
    text = app.engine.export_chat(chat_id, "json" if as_json else fmt)
    click.echo(text, nl=not text.endswith("\n"))


@cli.command()
@click.argument("kind", type=click.Choice(["doc", "chat"]))
@click.argument("item_id", type=int)
@json_option
@click.pass_obj
def rm(app: App, kind: str, item_id: int, as_json: bool):
    """Delete a document or a chat, with its caches."""
    only_reading(app)  # (nothing to delete where there is no data directory)
    used = app.store.usage_bytes()  # (what its caches took: freed, said)
    if kind == "doc":
        chats = app.engine.delete_document(item_id)
        freed = max(0, used - app.store.usage_bytes())
        emit({"deleted": kind, "id": item_id, "chats_kept": chats, "freed_bytes": freed},
             as_json, [f"deleted doc {item_id}, freeing {size_text(freed)} of caches" + (
                 f"; chat {chats[0]}, which was about it, keeps its messages and goes on "
                 "without it" if len(chats) == 1 else
                 f"; chats {', '.join(map(str, chats))}, which were about it, keep their "
                 "messages and go on without it" if chats else "")])
        return
    app.engine.delete_chat(item_id)
    freed = max(0, used - app.store.usage_bytes())
    emit({"deleted": kind, "id": item_id, "freed_bytes": freed}, as_json,
         [f"deleted {kind} {item_id}, freeing {size_text(freed)} of caches"])


