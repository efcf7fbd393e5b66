"""Commands about the installation and the store rather than a conversation: the model's
facts, the models on this machine, integrity checks, eviction, backups, the self-check, the
codec's calibration, the quality evaluation and the window.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..app import App
from ..errors import Cancelled, RuntimeStateError
from ..kv.evictions import evicted_line
from ..model.models import DEFAULT_MODEL_FILE, UnusableModelError
from ..options import GcOptions
from ..results import Progress, size_text
from ..settings import config_dir
from .base import (
    INTERRUPTED,
    TerminalProgress,
    cli,
    emit,
    error_line,
    interruptible,
    json_option,
    level_list,
    only_reading,
    print_json,
    stopped,
    stopper,
    values,
)


@cli.command()
@json_option
@click.pass_obj
def info(app: App, as_json: bool):
    """Show the model, its KV layout, its cache fingerprint and the sampling in effect."""
    app.reads_only = True
    if isinstance(missing := app.model_missing, UnusableModelError):  # (as at its load)
        emit({"model": str(missing.path), "model_error": str(missing),
              "data_dir": str(app.data_dir.resolve())}, as_json)
        sys.exit(1)
    if missing:  # the refusal, with where the rest is to be found
        facts = {"model": app.settings.model or DEFAULT_MODEL_FILE,
                 "data_dir": str(app.data_dir.resolve()),
                 "settings_file": str(config_dir() / "settings.json")}
        if as_json:
            print_json({"error": str(missing), "kind": type(missing).__name__, **facts})
        else:
            emit(facts, as_json)
        click.echo(error_line(missing), err=True)
        sys.exit(1)
    try:
        info = app.info()
    except RuntimeStateError as e:  # the model set does not load: which one it is, and why
        emit({"model": str(app.model_path), "model_error": str(e),
              "data_dir": str(app.data_dir.resolve())}, as_json)
        sys.exit(1)
    facts = {k: v for k, v in info.items() if k not in ("sampling", "sampling_notes")}
    emit(info, as_json, [f"{k}: {v}" for k, v in facts.items()] + ["sampling:"] + [
        f"  {name}: {'a new one each answer' if s['value'] is None else s['value']} "
        f"({s['from']})" for name, s in info["sampling"].items()]
        + [f"  note: {n}" for n in info["sampling_notes"]])


@cli.command()
@json_option
@click.pass_obj
def models(app: App, as_json: bool):
    """List the GGUF models on this machine (LM Studio, Ollama, GPT4All, Jan, the Hugging Face
    cache, the model_folders setting) and whether kvdesk supports them; --model takes a NAME."""
    app.reads_only = True
    found = app.list_models()
    lines = [f"{'NAME':<40} {'SOURCE':<11} {'ARCH':<10} {'PARAMS':>7} {'QUANT':<8} "
             f"{'CONTEXT':>7} {'KV/TOKEN':>9}  STATUS"]
    for m in found:
        params = f"{m.parameters / 1e9:.1f}B" if m.parameters else "?"
        kv = f"{m.kv_bytes_per_token / 1024:.0f} KiB" if m.kv_bytes_per_token else "?"
        lines.append(f"{m.name[:40]:<40} {m.source:<11} {m.architecture or '?':<10} "
                     f"{params:>7} {m.quantization or '?':<8} {m.context_length or '?':>7} "
                     f"{kv:>9}  {m.status}: {m.reason}")
    if not found:
        lines = ["no GGUF models found (kvdesk looks in LM Studio's, Ollama's, GPT4All's, "
                 "Jan's and the Hugging Face cache's folders, and the model_folders setting)"]
    emit([m.as_dict() for m in found], as_json, lines)


@cli.command()
@click.option("--repair", is_flag=True, help="Recompute damaged and missing chunks under this "
              "model; fetch an unusable codec calibration again from the shared cache (where "
              "it is not there, encode again the caches that need it); drop what other "
              "models' caches cannot have back.")
@json_option
@click.pass_obj
def verify(app: App, repair: bool, as_json: bool):
    """Check every stored KV chunk and codec calibration; set aside (and with --repair, fix)
    what fails or is missing."""
    if not repair or not app.holds_store:  # (no store: nothing to repair, none made)
        only_reading(app, said=as_json)  # (in text, "nothing to verify" below says it)
    report = app.store.verify()
    unusable = [c for c in report["calibrations"] if c["state"] != "ok"]
    found = bool(report["corrupt"] or report["missing"] or unusable)
    if report["database"]:  # nothing more is written to a damaged file, repairs included
        n = len(report["database"])
        emit(report, as_json, [f"the database file is damaged: {n} problem"
                               f"{'' if n == 1 else 's'} found by its check", *(
                                   f"  {x}" for x in report["database"][:20])])
        # (what it means and what to do: warned of above where the store opened damaged)
        click.echo(error_line(app.store.damage_error(), "the database file is damaged, as "
                              "warned of above"), err=True)
        sys.exit(1)
    unfixed = 0  # (what a repair left)
    if repair and found:
        bar = TerminalProgress()
        with interruptible() as cancel:
            report["repair"] = app.engine.repair(progress=bar, cancel=cancel)
        bar.done()
        # What the repair could not fix (a chunk not computed again) still fails to read
        store = app.store
        unfixed = len(store.quarantined()) + len(store.missing()) + len(
            store.unusable_calibrations())
    problems = [f"{len(report['corrupt'])} damaged"] if report["corrupt"] else []
    problems += [f"{len(report['missing'])} missing"] if report["missing"] else []
    problems += [f"{len(unusable)} unusable calibrations"] if unusable else []
    # (no store there, a mistyped --data-dir most often: "all intact" would vouch for it)
    lines = [f"{report['entries']} entries, {report['chunks']} chunks, "
             f"{report['bytes'] / 1e6:.1f} MB, {len(report['calibrations'])} codec "
             f"calibrations: " + (", ".join(problems) or "all intact")] if app.holds_store \
        else [f"nothing to verify: no kvdesk store in {app.data_dir}"]
    lines += [f"  damaged: entry {c['entry']} chunk {c['chunk']} level {c['level']}"
              + ("" if c["new"] else " (set aside before)") for c in report["corrupt"]]
    lines += [f"  missing: entry {c['entry']} chunk {c['chunk']} level {c['level']}"
              for c in report["missing"]]
    lines += [f"  calibration {c['id'][:12]}: {c['state']}, needed by {c['entries']} entries"
              for c in unusable]
    if "repair" in report:
        fixed = report["repair"]
        lines += fixed["messages"] + [
            f"repaired {len(fixed['repaired'])} chunks, encoded {len(fixed['reencoded'])} "
            f"entries again, fetched {len(fixed['recovered_calibrations'])} calibrations again "
            f"from the shared cache; dropped {len(fixed['dropped'])} levels of other models' "
            f"entries ({len(fixed['deleted_entries'])} entries deleted); removed "
            f"{len(fixed['removed_calibrations'])} damaged calibrations"]
        if any(r["calibration"] is None for r in fixed["reencoded"]):
            lines += ["this model has no usable codec calibration left: its caches use the "
                      "model-independent levels until `kvdesk calibrate`"]
        if unfixed:
            lines += [f"{unfixed} chunks or codec calibrations still need repairing: "
                      "`kvdesk verify` lists them"]
    elif found:
        lines += ["run `kvdesk verify --repair` to recompute them (they are not read meanwhile)"]
    if left := report["abandoned"]:
        lines += [f"{len(left)} unfinished writes of processes that are gone "
                  f"({size_text(sum(a['bytes'] for a in left))}): `kvdesk gc` removes them"]
    emit(report, as_json, lines)
    if found and ("repair" not in report or unfixed):
        sys.exit(1)


@cli.command()
@click.option("--budget-gb", type=float, help="Evict down to this (default: the setting).")
@json_option
@click.pass_obj
def gc(app: App, budget_gb: float | None, as_json: bool):
    """Evict least-recently-used caches beyond the storage budget."""
    only_reading(app)  # (nothing to evict where there is no data directory)
    budget = values(GcOptions, budget_gb=budget_gb).budget_gb
    bar = TerminalProgress()  # (evicting gigabytes takes a while: each cache its transaction)
    with interruptible() as cancel:
        report = app.store.gc(None if budget is None else int(budget * 1e9), cancel=cancel,
                              progress=lambda n, total: bar(
                                  Progress("freeing MB", n // 10**6, total // 10**6, "gc")))
    bar.done()
    removed = report["abandoned_documents"]
    # (stopped, it says what it did all the same, `stopped` in its JSON: what it evicted
    # stays evicted)
    emit(report, as_json, [f"freed {size_text(report['freed_bytes'])}; "
                           f"{size_text(report['bytes_after'])} of "
                           f"{size_text(report['budget_bytes'])} used",
                           *evicted_line(app.store, report["evicted_caches"]), *(
        [f"removed {len(removed)} document(s) whose attach or pull did not finish "
         f"and stored nothing: {', '.join(map(str, removed))} (attach or pull it again to "
         "have it)"]
        if removed else [])])
    if report["stopped"]:
        click.echo(f"Stopped by {stopper()}: what it evicted stays evicted (kvdesk gc again goes "
                   "on).", err=True)
        sys.exit(INTERRUPTED)


@cli.command()
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@click.option("--without-caches", is_flag=True, help="Leave out the KV caches (computed "
              "again when used): documents, chats, messages and settings only, far smaller.")
@json_option
@click.pass_obj
def backup(app: App, dest: Path, without_caches: bool, as_json: bool):
    """Copy the store to DEST (a new or empty folder), consistent while kvdesk runs."""
    from store.backup import backup as copy_store
    from store.errors import StoppedError

    bar = TerminalProgress()
    with interruptible() as cancel:
        try:
            done = copy_store(app.data_dir, dest.expanduser().absolute(),
                              caches=not without_caches, cancel=cancel,
                              progress=lambda n, total: bar(Progress("backup", n, total)))
        except StoppedError:
            bar.done()
            stopped(f"backup stopped; nothing was left in {dest}", as_json)
    bar.done()
    what = "without its caches" if without_caches else "with its caches"
    n = {k: "?" if done[k] is None else f"{done[k]:,}" for k in ("documents", "chats",
                                                                  "messages")}
    lines = [f"backed up {n['documents']} documents, {n['chats']} chats and "
             f"{n['messages']} messages ({what}, {size_text(done['bytes'])}) to "
             f"{done['file']} in {done['seconds']:.1f} s",
             f"see what it holds: kvdesk --data-dir {done['dest']} docs",
             f"to restore it: quit kvdesk, move the data folder {app.data_dir} aside and copy "
             f"{done['dest']} in its place (or set Settings' data folder to it)"]
    if done["damage"]:  # (not one to restore from: one to keep while the store is dealt with)
        lines[1:] = [f"the store is damaged, and this copy holds its damage too "
                     f"({done['damage'][0]}): keep it while you move the store aside",
                     lines[1]]
    emit(done, as_json, lines)


@cli.command()
@json_option
@click.pass_obj
def selfcheck(app: App, as_json: bool):
    """Check this installation end to end on a sample text (in a temporary data folder)."""
    from ..selfcheck import run as run_selfcheck  # the codec: only for this command

    report = run_selfcheck(app.settings, model_flag=app.model_flag)
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


def calibration_lines(cal) -> list[str]:
    lines = [f"calibration {cal.id[:12]} for {cal.model}: transform {cal.variant}, made in "
             f"{cal.seconds or 0:.0f} s", f"{'level':<10} {'bits/elem':>9} {'KLD':>8} "
             f"{'top-1':>6}  target"]
    for name, row in cal.levels.items():
        target = cal.targets.get(name)
        lines.append(f"{name:<10} {row['bits_per_element'] or 0:>9.3f} {row['kld'] or 0:>8.4f} "
                     f"{row['top1'] or 0:>6.3f}  {'' if target is None else f'{target:.4f}'}")
    return lines


STOPPED_CALIBRATING = ("calibration stopped; what it measured is kept, and the next run (of "
                       "calibrate, eval or the window's) goes on from there")
STOPPED_RECALIBRATING = ("calibration stopped; what it measured is kept, and the next "
                         "`kvdesk calibrate --force` goes on from there; until then the "
                         "calibration made before stays in use")


@cli.command()
@click.option("--force", is_flag=True, help="Calibrate again even if the model is calibrated.")
@json_option
@click.pass_obj
def calibrate(app: App, force: bool, as_json: bool):
    """Calibrate the codec's levels for the model (once, a few minutes): new caches of it are
    then encoded so that each level keeps its promise against llama.cpp's 8-bit KV."""
    engine = app.engine
    cal = None if force else engine.calibration()
    if cal is not None and not as_json:
        click.echo("already calibrated (--force calibrates again)", err=True)
    bar = TerminalProgress()
    with interruptible() as cancel:
        try:
            if cal is None:
                cal = engine.calibrate(progress=bar, cancel=cancel)
            else:  # the caches stored before it at other levels, if any are left
                done = engine.relevel(progress=bar, cancel=cancel)
                if done["entries"] and not as_json:
                    click.echo(f"{done['entries']} cache(s) stored before the calibration "
                               f"moved to its levels ({done['computed']} computed again from "
                               f"their text): {size_text(done['bytes_before'])} -> "
                               f"{size_text(done['bytes_after'])}", err=True)
                if done["stopped"] and not as_json:
                    click.echo(f"stopped ({done['stopped']}): {done['left']} cache(s) left "
                               "at the levels they were stored at, for the next `kvdesk "
                               "calibrate` (or start of the window or `kvdesk serve`)", err=True)
        except Cancelled:
            bar.done()
            # (a plain `calibrate` shows the calibration in use; only --force goes on)
            stopped(STOPPED_RECALIBRATING if force and engine.calibration() else
                    STOPPED_CALIBRATING, as_json)
    bar.done()
    emit(cal.as_dict(), as_json, calibration_lines(cal))


@cli.command("eval")
@click.argument("file", type=click.Path(exists=True, dir_okay=False))
@click.option("--prefix-tokens", type=click.IntRange(1), default=2048, show_default=True,
              help="Tokens of FILE whose KV each configuration restores.")
@click.option("--cont-tokens", type=click.IntRange(1), default=256, show_default=True,
              help="Following tokens, scored under teacher forcing.")
@click.option("--configs", callback=level_list,
              help="Comma-separated: fp16, fp16-ulp (the noise floor), q8_0, q4_0 "
              "and codec levels: the model's calibrated ones, default-LEVEL for the "
              "model-independent ones (default: all of them but lossless).")
@json_option
@click.pass_obj
def eval_(app: App, file: str, prefix_tokens: int, cont_tokens: int, configs: list[str] | None,
          as_json: bool):
    """Measure how closely compressed KV caches answer like the exact one, on FILE, with the
    model's codec calibration (made first, once, when it has none)."""
    from ..calibration import quality
    from ..chat import documents

    # The file and the configs checked first: a bad one is refused before minutes of work.
    text = documents.extract(file).text
    names = configs or [*quality.DEFAULT_CONFIGS, *(
        quality.DEFAULT_PREFIX + lvl for lvl in ("high", "balanced", "compact"))]
    engine = app.engine
    cal = engine.calibrations.current(engine.fingerprint)
    for name in names:
        quality.check_config(name, cal, calibrating=cal is None)
    try:
        quality.check_length(len(engine.runtime.tokenize(text, add_bos=True, special=False)),
                             prefix_tokens, cont_tokens)
    except quality.EvalError as e:
        raise quality.EvalError(f"{e}: a longer text, or smaller --prefix-tokens and "
                                "--cont-tokens") from None
    # (the calibrated levels, and the model-independent ones beside them, need the calibration)
    if cal is None and any(n in quality.CONTRACTS or n.startswith(quality.DEFAULT_PREFIX)
                           for n in names):
        click.echo("This model's codec is not calibrated yet: calibrating it first (a few "
                   "minutes, once; `kvdesk calibrate`).", err=True)
        bar = TerminalProgress()
        with interruptible() as cancel:
            try:
                engine.calibrate(progress=bar, cancel=cancel)
            except Cancelled:
                bar.done()
                stopped(STOPPED_CALIBRATING, as_json)
        bar.done()
        cal = engine.calibrations.current(engine.fingerprint)
    if not as_json:
        click.echo(f"{'config':<12} {'bits/elem':>9} {'KLD':>8} {'top-1':>6} {'ppl':>8}  greedy")

    def show(row: dict) -> None:
        if not as_json:  # rows as they finish: a full run takes minutes
            click.echo(f"{row['config']:<12} {row['bits_per_element']:>9.3f} {row['kld']:>8.4f} "
                       f"{row['top1']:>6.3f} {row['ppl']:>8.3f}  "
                       f"{'same' if row['greedy_match'] else 'differs'}")

    report = quality.evaluate(app.model_path, text, prefix_tokens=prefix_tokens,
                              cont_tokens=cont_tokens, configs=names, on_row=show,
                              calibration=cal)
    if as_json:
        emit(report, True)
        return
    for level, c in report.get("contracts", {}).items():
        click.echo(f"{level}: {c['contract']}: {c['value']:.4f} against {c['target']:.4f}: "
                   f"{'met' if c['met'] else 'NOT met'}")


@cli.command()
@click.pass_obj
def gui(app: App):
    """Open the desktop window (needs a display)."""
    from ..launcher import launch

    sys.exit(launch(app))


