"""The `kvdesk` command line: a thin click layer over `App`.

Every command accepts `--json` and then prints exactly one JSON document on stdout; progress
and logs go to stderr. Errors the user can act on (a missing model, a bad setting, a corrupt
cache) are printed as one clear line (or `{"error": ...}` with --json) and exit with status 1:
never a traceback.

No logic lives here that the GUI would need too: that belongs in `App` and the engine.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import threading

import click

from . import __version__, documents, quality
from .app import App
from .errors import USER_ERRORS
from .results import AttachFailure, Progress, levels_summary
from .runtime import Cancelled
from .selfcheck import run as run_selfcheck
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


class TerminalProgress:
    """A one-line progress display on stderr, redrawn in place on a terminal."""

    def __init__(self):
        self.tty = sys.stderr.isatty()
        self.last = None

    def __call__(self, p: Progress) -> None:
        pct = 100 * p.done // max(1, p.total)
        key = (p.title, p.phase, pct if self.tty else pct // 25)
        if key == self.last:
            return
        self.last = key
        line = f"{p.title + ': ' if p.title else ''}{p.phase} {pct:3d}% ({p.done:,}/{p.total:,})"
        if self.tty:
            click.echo(f"\r\033[K{line}", nl=False, err=True)
        else:
            click.echo(line, err=True)

    def done(self) -> None:
        if self.tty and self.last is not None:
            click.echo("\r\033[K", nl=False, err=True)
        self.last = None


@contextlib.contextmanager
def interruptible():
    """Ctrl-C sets a cancel event the engine checks between slices, so it stops cleanly."""
    cancel = threading.Event()

    def on_sigint(signum, frame):
        if cancel.is_set():  # a second Ctrl-C: the user really means it
            raise KeyboardInterrupt
        click.echo("\nStopping...", err=True)
        cancel.set()

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield cancel
    finally:
        signal.signal(signal.SIGINT, previous)


def _levels(value: str | None) -> list[str] | None:
    return [v.strip() for v in value.split(",") if v.strip()] if value else None


@cli.command()
@click.argument("files", nargs=-1, required=True, type=click.Path())
@click.option("--levels", help="Comma-separated codec levels to store (default: every level).")
@json_option
@click.pass_obj
def attach(app: App, files: tuple[str, ...], levels: str | None, as_json: bool):
    """Attach documents: extract, prefill once, compress and store their KV cache."""
    results, failed = [], False
    bar = TerminalProgress()
    with interruptible() as cancel:
        for path in files:
            try:
                res = app.engine.attach(path, levels=_levels(levels), progress=bar,
                                        cancel=cancel)
            except Cancelled:
                bar.done()
                click.echo(f"{path}: cancelled; nothing was stored", err=True)
                failed = True
                break
            except USER_ERRORS as e:
                bar.done()
                click.echo(f"Error: {e}", err=True)
                results.append(AttachFailure(path, str(e)).as_dict())
                failed = True
                continue
            bar.done()
            for w in res.warnings:
                click.echo(f"Warning: {w}", err=True)
            results.append(res.as_dict())
            if not as_json:
                sizes = ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in res.stored_bytes.items())
                how = "already cached" if res.reused else (
                    f"from the shared cache in {res.encode_s:.1f} s" if res.pulled else
                    f"prefill {res.prefill_s:.1f} s, encode {res.encode_s:.1f} s")
                how += "; shared" if res.pushed else ""
                click.echo(f"[{res.doc_id}] {res.title}: {res.kept_tokens:,} tokens ({how}); "
                           f"raw {res.raw_bytes / 1e6:.1f} MB -> {sizes}")
    if as_json:
        click.echo(json.dumps(results, indent=2))
    if failed:
        sys.exit(1)


def _restore_options(f):
    for opt in reversed([
        click.option("--level", default="auto", show_default=True,
                     help="auto (adaptive per chunk) or a codec level to force."),
        click.option("--budget-ms", type=float, help="Time budget for the restore."),
        click.option("--bandwidth-MBps", "bandwidth_MBps", type=float,
                     help="Read bandwidth to plan for and throttle to (a slow link)."),
        click.option("--no-cache", is_flag=True, help="Recompute from text (the baseline)."),
    ]):
        f = opt(f)
    return f


def _say(messages: list[str]) -> None:
    for m in messages:
        click.echo(f"Note: {m}", err=True)


@cli.command(context_settings={"ignore_unknown_options": False})
@click.argument("args", nargs=-1, required=True, metavar="[DOC_ID] QUESTION")
@click.option("--chat", "chat_id", type=int, help="Continue this chat instead of a new one.")
@_restore_options
@click.option("--max-tokens", type=int, default=512, show_default=True)
@click.option("--seed", type=int, help="Sample with this seed (default: greedy).")
@click.option("--temperature", type=float, help="Sampling temperature (default 0.8 with --seed).")
@json_option
@click.pass_obj
def ask(app: App, args, chat_id, level, budget_ms, bandwidth_MBps, no_cache,
        max_tokens, seed, temperature, as_json):
    """Ask about a document (a new chat), or continue a chat with --chat."""
    if chat_id is not None and len(args) == 1:
        doc_id, question = None, args[0]
    elif chat_id is None and len(args) == 2 and args[0].isdigit():
        doc_id, question = int(args[0]), args[1]
    else:
        raise click.UsageError("usage: kvdesk ask DOC_ID QUESTION, or kvdesk ask --chat "
                               "CHAT_ID QUESTION (quote the question)")
    if temperature is None:
        temperature = 0.8 if seed is not None else 0.0
    bar = TerminalProgress()
    streamed = []

    def on_token(text: str) -> None:
        if not as_json:
            if not streamed:
                bar.done()
            click.echo(text, nl=False)
        streamed.append(text)

    with interruptible() as cancel:
        res = app.engine.ask(
            question, chat_id=chat_id, doc_id=doc_id, level=level, budget_ms=budget_ms,
            bandwidth_MBps=bandwidth_MBps, no_cache=no_cache, max_tokens=max_tokens,
            seed=seed, temperature=temperature, on_token=on_token,
            on_restore=lambda r: _say(r.messages), progress=bar, cancel=cancel)
    if as_json:
        click.echo(json.dumps({k: v for k, v in res.as_dict().items() if k != "messages"},
                              indent=2))
    else:
        click.echo()
        click.echo(f"[chat {res.chat_id}] first token after {res.ttft_s * 1000:.0f} ms "
                   f"(restore {res.restore_s * 1000:.0f} ms, {_levels_summary(res.chunk_levels)})",
                   err=True)


def _levels_summary(levels: list[str]) -> str:
    return levels_summary(levels) if levels else "nothing to restore"


@cli.command()
@click.argument("chat_id", type=int)
@_restore_options
@json_option
@click.pass_obj
def reopen(app: App, chat_id, level, budget_ms, bandwidth_MBps, no_cache, as_json):
    """Restore a chat's context into the model and report how."""
    bar = TerminalProgress()
    with interruptible() as cancel:
        rep = app.engine.reopen(chat_id, level=level, budget_ms=budget_ms,
                                bandwidth_MBps=bandwidth_MBps, no_cache=no_cache,
                                progress=bar, cancel=cancel)
    bar.done()
    _say(rep.messages)
    out = {"chat_id": chat_id, "tokens": rep.tokens, "restore_s": round(rep.restore_s, 4),
           "chunk_levels": rep.chunk_levels, "recomputed_tokens": rep.recomputed_tokens}
    emit(out, as_json, [f"restored {rep.tokens:,} tokens in {rep.restore_s * 1000:.0f} ms "
                        f"({_levels_summary(rep.chunk_levels)}; "
                        f"{rep.recomputed_tokens:,} recomputed)"])


@cli.command()
@json_option
@click.pass_obj
def docs(app: App, as_json: bool):
    """List attached documents and their caches."""
    rows = app.engine.documents()
    emit([d.as_dict() for d in rows], as_json, [
        f"[{d.doc_id}] {d.title} — {d.tokens:,} tokens, {d.status}, "
        f"{sum(d.cache_bytes.values()) / 1e6:.1f} MB cached" for d in rows])


@cli.command()
@json_option
@click.pass_obj
def chats(app: App, as_json: bool):
    """List chats, most recent first."""
    rows = app.engine.chats()
    emit([c.as_dict() for c in rows], as_json, [
        f"[{c.chat_id}] {c.title} — {c.messages} messages" for c in rows])


@cli.command()
@click.argument("kind", type=click.Choice(["doc", "chat"]))
@click.argument("item_id", type=int)
@json_option
@click.pass_obj
def rm(app: App, kind: str, item_id: int, as_json: bool):
    """Delete a document or a chat, with its caches."""
    if kind == "doc":
        app.engine.delete_document(item_id)
    else:
        app.engine.delete_chat(item_id)
    emit({"deleted": kind, "id": item_id}, as_json, [f"deleted {kind} {item_id}"])


@cli.command()
@json_option
@click.pass_obj
def verify(app: App, as_json: bool):
    """Check every stored KV chunk against its checksum."""
    report = app.store.verify()
    emit(report, as_json, [
        f"{report['entries']} entries, {report['chunks']} chunks, "
        f"{report['bytes'] / 1e6:.1f} MB: "
        + (f"{len(report['corrupt'])} corrupt" if report["corrupt"] else "all intact")]
        + [f"  corrupt: entry {c['entry']} chunk {c['chunk']} level {c['level']}"
           for c in report["corrupt"]])
    if report["corrupt"]:
        sys.exit(1)


@cli.command()
@click.option("--budget-gb", type=float, help="Evict down to this (default: the setting).")
@json_option
@click.pass_obj
def gc(app: App, budget_gb: float | None, as_json: bool):
    """Evict least-recently-used caches beyond the storage budget."""
    report = app.store.gc(None if budget_gb is None else int(budget_gb * 1e9))
    emit(report, as_json, [f"freed {report['freed_bytes'] / 1e6:.1f} MB; "
                           f"{report['bytes_after'] / 1e6:.1f} MB of "
                           f"{report['budget_bytes'] / 1e9:.1f} GB used"])


@cli.command()
@json_option
@click.pass_obj
def selfcheck(app: App, as_json: bool):
    """Check this installation end to end on a sample text (in a temporary data folder)."""
    report = run_selfcheck(app.settings)
    if report["ok"]:
        emit(report, as_json, [
            f"ok: first token after {report['ttft_s'] * 1000:.0f} ms; reopened "
            f"{report['tokens']:,} tokens through {report['level']} in "
            f"{report['restore_s'] * 1000:.0f} ms ({report['seconds']:.1f} s in all)"])
        return
    emit(report, as_json, [])
    if not as_json:
        click.echo(f"selfcheck FAILED: {report['error']}\n{report['traceback']}", err=True)
    sys.exit(1)


@cli.command("eval")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--prefix-tokens", type=int, default=2048, show_default=True,
              help="Tokens of FILE whose KV each configuration restores.")
@click.option("--cont-tokens", type=int, default=256, show_default=True,
              help="Following tokens, scored under teacher forcing.")
@click.option("--configs", help="Comma-separated: fp16, fp16-ulp (the noise floor), q8_0, q4_0 "
              f"and codec levels (default: {','.join(quality.DEFAULT_CONFIGS)}).")
@json_option
@click.pass_obj
def eval_(app: App, file: str, prefix_tokens: int, cont_tokens: int, configs: str | None,
          as_json: bool):
    """Measure how closely compressed KV caches answer like the exact one, on FILE."""
    names = _levels(configs) or list(quality.DEFAULT_CONFIGS)
    if not as_json:
        click.echo(f"{'config':<12} {'bits/elem':>9} {'KLD':>8} {'top-1':>6} {'ppl':>8}  greedy")

    def show(row: dict) -> None:
        if not as_json:  # rows as they finish: a full run takes minutes
            click.echo(f"{row['config']:<12} {row['bits_per_element']:>9.3f} {row['kld']:>8.4f} "
                       f"{row['top1']:>6.3f} {row['ppl']:>8.3f}  "
                       f"{'same' if row['greedy_match'] else 'differs'}")

    try:
        report = quality.evaluate(app.model_path, documents.extract(file).text,
                                  prefix_tokens=prefix_tokens, cont_tokens=cont_tokens,
                                  configs=names, on_row=show)
    except quality.EvalError as e:
        emit({"error": str(e), "kind": "EvalError"}, as_json, [])
        click.echo(f"Error: {e}", err=True)
        sys.exit(1)
    if as_json:
        emit(report, True)


@cli.group()
def remote():
    """The shared cache: KV caches on S3-compatible storage, for a team or several machines.

    Set remote_bucket (and remote_endpoint_url, remote_prefix) in the settings or the
    KVDESK_REMOTE_* variables; credentials come from the AWS environment or ~/.aws.
    """


@remote.command("status")
@json_option
@click.pass_obj
def remote_status(app: App, as_json: bool):
    """Whether the bucket answers, and the documents cached here and there for this model."""
    # Not configured: said without loading the model or opening the store.
    report = app.engine.sharing.status(app.engine.fingerprint) if app.remote else \
        {"configured": False}
    if not report["configured"]:
        lines = ["no shared cache configured (settings remote_bucket, remote_endpoint_url)"]
    else:
        lines = [f"{report['endpoint']} bucket {report['bucket']!r} prefix "
                 f"{report['prefix']!r}: "
                 + ("reachable" if report["reachable"] else f"UNREACHABLE: {report['error']}"),
                 f"documents cached here: {report['local_entries']}"]
        if report["reachable"]:
            lines += [f"documents shared there: {report['remote_entries']} "
                      f"({report['only_local']} only here, {report['only_remote']} only there)"]
        lines += [f"automatic push: {'on' if report['auto_push'] else 'off'}, "
                  f"automatic pull: {'on' if report['auto_pull'] else 'off'}"]
    emit(report, as_json, lines)
    if report["configured"] and not report["reachable"]:
        sys.exit(1)


def _transfer_lines(report: dict, key: str, left: str, lazy: bool = False) -> list[str]:
    return ([f"added {t['title']} ({t['tokens']:,} tokens; its cache streams when first used)"
             if lazy else f"{key} {t['title']}: {t['tokens']:,} tokens, {t['objects']} objects, "
             f"{t['bytes'] / 1e6:.1f} MB" for t in report[key]]
            + [f"{report[left]} {left.replace('_', ' ')}"]
            + [f"FAILED: {f['error']}" for f in report["failed"]])


@remote.command("push")
@json_option
@click.pass_obj
def remote_push(app: App, as_json: bool):
    """Upload this model's document caches the shared cache lacks."""
    bar = TerminalProgress()
    report = app.engine.sharing.push(app.engine.fingerprint,
                                     progress=lambda d, t: bar(Progress("push", d, t)))
    bar.done()
    emit(report, as_json, _transfer_lines(report, "pushed", "already_remote"))
    if report["failed"]:
        sys.exit(1)


@remote.command("pull")
@click.option("--lazy", is_flag=True, help="Only add the documents; their caches stream from "
              "the shared cache when first asked about.")
@json_option
@click.pass_obj
def remote_pull(app: App, lazy: bool, as_json: bool):
    """Download this model's document caches from the shared cache (with their documents)."""
    bar = TerminalProgress()
    report = app.engine.sharing.pull(app.engine.fingerprint, lazy=lazy,
                                     progress=lambda d, t: bar(Progress("pull", d, t)))
    bar.done()
    emit(report, as_json, _transfer_lines(report, "pulled", "already_local", lazy))
    if report["failed"]:
        sys.exit(1)


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
