"""`kvdesk remote`: the shared cache on S3-compatible storage (status, push, pull, verify).

Push, pull and verify stop on Ctrl-C before their next object, as attach does between
slices: what was done is said, and what was not, and the exit status is 130. They never
leave a half-moved cache: a pull's copy under way is dropped (a pull again takes it), a
push's is not shared until its manifest is written (a push again sends the rest).
"""

from __future__ import annotations

import sys

import click

from ..app import App
from ..formats.folders import one_line
from ..results import Progress, counted, size_text
from .base import (
    INTERRUPTED,
    TerminalProgress,
    Unsettled,
    cli,
    emit,
    interruptible,
    json_option,
    only_reading,
    say,
    stopper,
)


@cli.group()
@click.pass_obj
def remote(app: App):
    """The shared cache: KV caches on S3-compatible storage, for a team or several machines.

    Set remote_bucket (and remote_endpoint_url, remote_prefix) in the settings or the
    KVDESK_REMOTE_* variables; credentials come from the AWS environment or ~/.aws.
    """
    # A hung bucket's three attempts are said as they come. (Where only help is asked for,
    # with a setting refused, there is no app to ask.)
    if not isinstance(app, Unsettled) and app.remote is not None:
        app.remote.on_retry = lambda message: say([message])


@remote.command("status")
@json_option
@click.pass_obj
def remote_status(app: App, as_json: bool):
    """Whether the bucket answers, and the documents cached here and there for this model."""
    only_reading(app)  # (a mistyped --data-dir is not made a new, empty store)
    # Not configured: said without loading the model or opening the store.
    report = app.engine.sharing.status(app.engine.fingerprint) if app.remote else \
        {"configured": False}
    if not report["configured"]:
        lines = ["no shared cache configured: set remote_bucket (and remote_endpoint_url for "
                 "a server other than AWS S3) in the settings, or KVDESK_REMOTE_BUCKET"]
    else:
        lines = [f"{report['endpoint']} bucket {report['bucket']!r} prefix "
                 f"{report['prefix']!r}: "
                 + ("reachable" if report["reachable"] else f"NOT USABLE: {report['error']}"),
                 f"caches that travel (documents' and passages'), here: "
                 f"{report['local_entries']}"]
        if report["reachable"]:
            lines += [f"shared there: {report['remote_entries']} "
                      f"({report['only_local']} only here, {report['only_remote']} only there"
                      + (f", {len(report['damaged'])} of those damaged" if report["damaged"]
                         else "") + ")"]
            lines += [f"DAMAGED: {d['error']}: a pull cannot take it; `kvdesk remote push` "
                      "where its cache is held writes it again" for d in report["damaged"]]
        lines += [f"automatic push: {'on' if report['auto_push'] else 'off'}, "
                  f"automatic pull: {'on' if report['auto_pull'] else 'off'}"]
    emit(report, as_json, lines)
    if report["configured"] and (not report["reachable"] or report["damaged"]):
        sys.exit(1)


def _transfer(as_json: bool, run, phase: str, key: str, left: str, lazy: bool = False) -> None:
    """Run a push or pull (`run(progress, cancel)`) with a progress bar, and say what it
    moved (and, stopped by Ctrl-C, what it did not)."""
    bar = TerminalProgress()
    with interruptible() as cancel:
        report = run(lambda d, t: bar(Progress(phase, d, t)), cancel)
    bar.done()
    emit(report, as_json, [
        f"added {one_line(t['title'])} ({t['tokens']:,} tokens; its cache streams when first used)"
        if lazy else f"{key} {one_line(t['title'])}: {t['tokens']:,} tokens, "
        f"{counted(t['objects'], 'object')}, "
        f"{t['bytes'] / 1e6:.1f} MB" for t in report[key]]
        + [f"{report[left]} {left.replace('_', ' ')}"]
        + ([f"{report['passages_left']} passage cache(s) stay in the shared cache: a question "
            "takes those it needs"] if report.get("passages_left") else [])
        + [f"not kept {one_line(t['title'])}: its cache ({size_text(t['bytes'])}) is larger "
           f"than the whole storage budget of {size_text(t['budget_bytes'])} (the setting "
           "storage_budget_gb); added without it, its cache streams when first used"
           for t in report.get("not_kept", ())]
        + _evicted_lines(report.get("evicted", ()))
        + [f"{one_line(t['title'])}: kept without its {level} level, whose objects in the "
           f"shared cache failed ({error}); `kvdesk remote verify --repair` where it is held "
           "puts them back"
           for t in report.get("levels_left_out", ()) for level, error in t["left_out"].items()]
        + [f"FAILED: {one_line(f['title']) + ': ' if f.get('title') else ''}{f['error']}"
           for f in report["failed"]])
    if cancel.is_set():
        _stopped(report["not_done"], "shared cache(s) not pulled: `kvdesk remote pull` again "
                 "takes them" if phase == "pull" else "cache(s) of this machine not pushed: "
                 "`kvdesk remote push` again sends them")
    if report["failed"]:
        sys.exit(1)


def _stopped(not_done: int, what: str) -> None:
    """Exit as Ctrl-C stopped the command, saying what it left (what it did is said above);
    one that came after the last object stopped nothing: the command ends as it would have."""
    if not not_done:
        say([f"{stopper()} came after the last one: nothing was left to do"])
        return
    say([f"stopped: {not_done} {what}"])
    sys.exit(INTERRUPTED)


def _evicted_lines(caches) -> list[str]:
    """What a pull's caches evicted to keep within the storage budget, named."""
    if not caches:
        return []
    names = dict.fromkeys(one_line(c["title"] or "") or (
        "a chat's cache" if c["chat_id"] else "a cache") for c in caches)
    return [f"evicted to keep within the storage budget: {', '.join(names)} "
            f"({size_text(sum(c['bytes'] for c in caches))}); a question takes them from "
            "the shared cache again, or computes them"]


@remote.command("push")
@json_option
@click.pass_obj
def remote_push(app: App, as_json: bool):
    """Upload this model's document caches the shared cache lacks."""
    only_reading(app)  # (it reads this machine's caches: none where no store is)
    _transfer(as_json, lambda progress, cancel: app.engine.sharing.push(
        app.engine.fingerprint, progress=progress, cancel=cancel), "push", "pushed",
        "already_remote")


@remote.command("pull")
@click.option("--lazy", is_flag=True, help="Only add the documents; their caches stream from "
              "the shared cache when first asked about.")
@json_option
@click.pass_obj
def remote_pull(app: App, lazy: bool, as_json: bool):
    """Download this model's document caches from the shared cache (with their documents)."""
    _transfer(as_json, lambda progress, cancel: app.engine.sharing.pull(
        app.engine.fingerprint, lazy=lazy, progress=progress, cancel=cancel), "pull", "pulled",
        "already_local", lazy)


@remote.command("verify")
@click.option("--repair", is_flag=True, help="Put back, from this machine's own copy, the "
              "objects missing or damaged in the shared cache.")
@json_option
@click.pass_obj
def remote_verify(app: App, repair: bool, as_json: bool):
    """Read back every shared object of the caches this machine holds, and check it."""
    only_reading(app)  # (a repair writes to the bucket only, from the caches held here)
    with interruptible() as cancel:
        report = app.engine.sharing.verify(app.engine.fingerprint, repair=repair,
                                           cancel=cancel)
    left = len(report["damaged"]) - report["repaired"] + len(report["failed"])
    emit(report, as_json, [
        f"{report['checked']} shared cache{'' if report['checked'] == 1 else 's'} checked "
        f"({report['objects']:,} objects; "
        f"{report['not_shared']} held here only)"]
        + [f"DAMAGED: {one_line(d['title'])}: {d['error']}" for d in report["damaged"]]
        + [f"FAILED: entry {f['entry']}: {f['error']} (`kvdesk verify --repair` first)"
           for f in report["failed"]]
        + ([f"{report['repaired']} put back from this machine's copy"] if repair else [])
        + ([f"{left} not repaired: `kvdesk remote verify --repair` puts back what this "
            "machine holds"] if left and not repair else
           [f"{left} not held here: run it where they are"] if left else []))
    if cancel.is_set():
        _stopped(report["not_done"], "cache(s) of this machine not checked: `kvdesk remote "
                 "verify` again checks them all")
    if left:
        sys.exit(1)
