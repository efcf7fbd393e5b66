"""What `kvdesk ask` prints of an answer, over a fake engine (no model): the notes it says on
stderr are the ones `--json` carries in `messages`; interrupted for good, `--json` still
prints one JSON document."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

import desktop_app.cli.base as base
from desktop_app.cli import cli
from desktop_app.errors import ChatFullError
from desktop_app.results import AskResult, AttachResult, Progress


class FakeEngine:
    levels = ()  # (no codec kernels to wait for: `say_compiling` says nothing)

    def __init__(self, pieces: list[str], finish_reason: str, *, stop: bool = False,
                 blended: dict | None = None):
        self.pieces, self.finish_reason, self.stop, self.blended = \
            pieces, finish_reason, stop, blended

    def ask(self, question, *, on_token, on_restore, cancel, **options) -> AskResult:
        for piece in self.pieces:
            on_token(piece)
        if self.stop:
            cancel.set()  # as the Ctrl-C handler does
        text = "".join(self.pieces)
        return AskResult(chat_id=1, answer=text.strip(), ttft_s=0.1, restore_s=0.0,
                         bytes_read=0, chunk_levels=[], recomputed_tokens=0,
                         tokens_generated=len(self.pieces),
                         messages=["a note of the engine's"], blended=self.blended,
                         finish_reason=self.finish_reason)


@pytest.fixture
def fake_app(monkeypatch, tmp_path):
    """`cli.base.App` made an app over `make_engine()`: set it per test."""
    monkeypatch.setenv("KVDESK_CONFIG_DIR", str(tmp_path / "config"))

    def use(make_engine):
        class FakeApp:
            def __init__(self, settings, *, background, model_flag=False):
                self.engine = make_engine()
                self.data_dir, self.reads_only = tmp_path, False
                self.holds_store = True

            def preload(self):
                pass

            def close(self):
                pass

        monkeypatch.setattr(base, "App", FakeApp)
    return use


@pytest.fixture
def run(fake_app, tmp_path):
    """`kvdesk --data-dir ... ask --no-server ARGS` over a FakeEngine(**answer): (stdout,
    stderr)."""
    def invoke(*args: str, **answer):
        fake_app(lambda: FakeEngine(**answer))
        result = CliRunner().invoke(cli, ["--data-dir", str(tmp_path / "data"), "ask",
                                          "--no-server", "1", "Where is the key?", *args])
        assert result.exit_code == 0, (result.output, result.exception)
        return result.stdout, result.stderr

    return invoke


def notes(stderr: str) -> list[str]:
    return [line.removeprefix("Note: ") for line in stderr.splitlines()
            if line.startswith("Note: ")]


@pytest.mark.parametrize(("answer", "said"), [
    ({"pieces": ["In", " the"], "finish_reason": "length"},
     "the answer stopped at its limit of 2 tokens"),
    ({"pieces": ["In"], "finish_reason": "cancelled", "stop": True},
     "stopped (Ctrl-C): the answer so far is kept"),
])
def test_the_json_carries_the_notes_the_plain_output_says(run, answer, said):
    _, plain = run(**answer)
    out, err = run("--json", **answer)
    assert any(n.startswith(said) for n in notes(plain)), plain
    assert json.loads(out)["messages"] == notes(plain) == notes(err)
    assert notes(plain)[0] == "a note of the engine's"


def test_a_stopped_blended_chats_note_is_in_the_json_too(run):
    answer = {"pieces": ["In"], "finish_reason": "cancelled", "stop": True,
              "blended": {"mode": "blended"}}
    out, err = run("--json", **answer)
    messages = json.loads(out)["messages"]
    assert messages == notes(err) and len(messages) == 3
    assert "exact context was not computed" in messages[-1]



def test_an_answer_the_servers_stop_cut_short_fails_with_the_answer_so_far(fake_app, tmp_path):
    """Answered by a `kvdesk serve` that stopped partway (its finish reason "server_stopped",
    its note): the answer so far printed, the note said, and exit status 1, so that a script
    keeps no cut answer as a whole one; --json carries both."""
    cut = "the answer was cut short: the kvdesk server is stopping (ask again once it is back)"

    class ServerStopped(FakeEngine):
        def ask(self, question, **options):
            done = super().ask(question, **options)
            return AskResult(**{**done.as_dict(), "messages": [cut]})

    fake_app(lambda: ServerStopped(["The Alpha", " project"], "server_stopped"))
    for flag in ([], ["--json"]):
        result = CliRunner().invoke(cli, ["--data-dir", str(tmp_path / "data"), "ask",
                                          "--no-server", "1", "Summarize it.", *flag])
        assert result.exit_code == 1 and notes(result.stderr) == [cut], result.stderr
        assert "Traceback" not in result.stderr and "stopped (Ctrl-C)" not in result.stderr
    assert result.stdout.startswith("{")  # (one JSON document)
    got = json.loads(result.stdout)
    assert got["answer"] == "The Alpha project" and got["finish_reason"] == "server_stopped"
    assert got["messages"] == [cut]


EVICTED = ("storing chat 1's exact context evicted the least recently used caches to keep "
           "within the storage budget of 20.0 MB: 2 chat cache(s), 9 passage(s) (8.1 MB); they "
           "are computed again when next used")


class ExactPass:
    """The engine's exact pass of a blended chat, done, having evicted caches."""

    def request(self, chat_id):
        pass

    def finish(self, chat_id, **_):
        return True

    def said(self, chat_id):
        return {chat_id: [EVICTED]}


def test_what_the_exact_pass_after_an_answer_evicted_is_said_and_in_the_json(fake_app,
                                                                              tmp_path):
    """It said "the exact context is stored: the next turns and reopens of this chat are
    exact" and nothing of the other chats' exact contexts and passages storing it evicted."""
    class Blended(FakeEngine):
        exactness = ExactPass()

    fake_app(lambda: Blended(["In"], "stop", blended={"mode": "blended"}))
    said = {}
    for flag in ([], ["--json"]):
        result = CliRunner().invoke(cli, ["--data-dir", str(tmp_path / "data"), "ask",
                                          "--no-server", "1", "Where?", *flag])
        assert result.exit_code == 0, (result.output, result.exception)
        said[bool(flag)] = notes(result.stderr)
        assert said[bool(flag)][-2:] == ["the exact context is stored: the next turns and "
                                         "reopens of this chat are exact", EVICTED]
    assert json.loads(result.stdout)["messages"] == said[True] == said[False]


def test_a_second_ctrl_c_still_prints_one_json_document(fake_app, tmp_path, capsys):
    """The first Ctrl-C stops the work cleanly; a second one ends the process at once (130),
    and a script reading `--json` output gets one JSON document saying so, not nothing; if the
    answer's was printed already (the second Ctrl-C came while the chat's exact context was
    computed after it), that one alone."""
    from types import SimpleNamespace

    from desktop_app.cli import main

    class Interrupted(FakeEngine):
        def ask(self, question, **options):
            raise KeyboardInterrupt  # the second Ctrl-C (cli.base.interruptible)

    def interrupted_after(chat_id, **_):
        raise KeyboardInterrupt

    class Blended(FakeEngine):  # answered blended: the exact context is computed after
        exactness = SimpleNamespace(request=lambda chat_id: None, finish=interrupted_after)

    args = ["--data-dir", str(tmp_path / "data"), "ask", "--no-server", "1", "Where?", "--json"]
    fake_app(lambda: Interrupted([], "stop"))
    with pytest.raises(SystemExit) as ended:
        main(args)
    out = capsys.readouterr()
    assert ended.value.code == 130 and "Aborted." in out.err
    assert json.loads(out.out) == {"error": "interrupted", "kind": "Interrupted"}
    fake_app(lambda: Blended(["In", " the drawer."], "stop", blended={"mode": "blended"}))
    with pytest.raises(SystemExit) as ended:
        main(args)
    out = capsys.readouterr()
    assert ended.value.code == 130 and json.loads(out.out)["answer"] == "In the drawer."


@pytest.mark.parametrize("where", ["stopped while encoding", "stopped before the answer began"])
def test_a_ctrl_c_before_the_answer_began_is_said_plainly(fake_app, tmp_path, where):
    """Stopped before its first word, wherever the work was (a passage's KV being computed,
    the context restored): the user is told that nothing of the turn is stored, not an
    error about what was running."""
    from desktop_app.errors import Cancelled

    class StoppedEarly(FakeEngine):
        def ask(self, question, *, cancel, **options):
            cancel.set()  # as the Ctrl-C handler does
            raise Cancelled(where)

    fake_app(lambda: StoppedEarly([], "stop"))
    for json_flag in ([], ["--json"]):
        result = CliRunner().invoke(cli, ["--data-dir", str(tmp_path / "data"), "ask",
                                          "--no-server", "1", "Where?", *json_flag])
        assert result.exit_code == 130 and "Error" not in result.stderr
        assert result.stderr.strip() == ("Stopped before the answer began: nothing of this "
                                         "turn is stored.")
        if json_flag:
            assert json.loads(result.stdout) == {"error": "stopped before the answer began: "
                                                 "nothing of this turn is stored",
                                                 "kind": "Cancelled"}


def test_the_sources_of_a_plain_answer_name_their_documents_by_title(
        fake_app, monkeypatch, tmp_path):
    """`kvdesk ask` over two long documents: each source line names its document's title
    (one deleted since: its id), as the export does."""
    from desktop_app.results import Source
    from store import Store

    store = Store(tmp_path / "data")
    doc = store.add_document("h", "long.py", "x", type="code")
    sources = [Source(1, doc.id, 209, "x", 0.5, lines=(3, 4)).as_dict(),
               Source(2, doc.id + 1, 7, "y", 0.4, lines=(1, 2)).as_dict()]

    class Answering(FakeEngine):
        def ask(self, question, **kw) -> AskResult:
            from dataclasses import replace
            return replace(super().ask(question, **kw), sources=sources)

    fake_app(lambda: Answering(["In"], "stop"))
    monkeypatch.setattr(base.App, "store", store, raising=False)
    result = CliRunner().invoke(cli, ["--data-dir", str(tmp_path / "data"), "ask",
                                      "--no-server", "1", "Where is the key?"])
    store.close()
    assert result.exit_code == 0, (result.output, result.exception)
    # (the one retrieval scored above the other marked: listed in the order read, probe L1)
    assert (f"source: long.py #209 [lines 3-4] (best match)\nsource: document {doc.id + 1} "
            "#7 [lines 1-2]\n") in result.stderr


def test_a_turn_held_by_another_process_is_said_in_words(capsys):
    """(It read "wait   0% (0/1)" while another process answered in the chat.)"""
    progress = base.TerminalProgress()
    progress(Progress("wait", 0, 1))
    progress(Progress("restore", 1, 4))
    err = capsys.readouterr().err.splitlines()
    assert err == [base.WAITING, "restore  25% (1/4)"]
    assert "another kvdesk process" in base.WAITING


def test_a_title_with_a_line_break_keeps_its_progress_on_one_line(capsys):
    """(An attach of "new<LF>line.txt" split its progress over two lines.)"""
    progress = base.TerminalProgress()
    progress(Progress("prefill", 1, 4, title="new\nline\a.txt"))
    assert capsys.readouterr().err == "new\\nline\\x07.txt: prefill  25% (1/4)\n"


def test_a_pulls_lines_name_a_title_with_a_line_break_on_one_line():
    """(`remote` printed titles raw, a row split over two lines, as `ask`'s sources did.)"""
    from desktop_app.cli.remote import _evicted_lines

    said = _evicted_lines([{"title": "new\nline.txt", "chat_id": None, "bytes": 2048}])
    assert len(said) == 1 and "new\\nline.txt" in said[0] and "\n" not in said[0]


def test_a_note_said_during_progress_on_a_terminal_takes_a_line_of_its_own(capsys,
                                                                            monkeypatch):
    """(A pull's retry note ran on after the progress line: "pull  40% (2/5)Note: ...".)"""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    monkeypatch.setenv("TERM", "xterm-256color")
    progress = base.TerminalProgress()
    progress(Progress("pull", 2, 5))
    base.say(["the shared cache did not answer; trying again (2 of 3)"])
    err = capsys.readouterr().err
    assert err == ("\r\033[Kpull  40% (2/5)"
                   "\r\033[KNote: the shared cache did not answer; trying again (2 of 3)\n")


def test_an_attach_the_storage_budget_could_not_keep_says_not_stored(fake_app, tmp_path):
    """(It said "raw 35.6 MB -> high 0.0 MB, balanced 0.0 MB, compact 0.0 MB", as if the
    codec had made nothing of it.)"""
    class Attaching:
        levels = ()

        def attach(self, path, **options) -> AttachResult:
            return AttachResult(1, "big.txt", 5000, 5000, 9.0, 1.0, 35_600_000,
                                {"high": 0, "balanced": 0}, warnings=["this cache ... is "
                                "larger than the whole storage budget: it is not stored"])

    fake_app(Attaching)
    (tmp_path / "big.txt").write_text("text")
    result = CliRunner().invoke(cli, ["--data-dir", str(tmp_path / "data"), "attach",
                                      "--no-server", str(tmp_path / "big.txt")])
    assert result.exit_code == 0, result.output
    assert "raw 35.6 MB -> not stored" in result.stdout and "0.0 MB" not in result.stdout


def test_an_attach_that_stored_nothing_gives_no_calibration_advice(fake_app, tmp_path):
    """A cache larger than the whole budget, not stored: it went on "codec: model-independent
    levels (this model is not calibrated yet: `kvdesk calibrate`...)" of a calibrated model
    (the result names no calibration: nothing was encoded for it)."""
    advice = ("the document is attached all the same: a question about it computes its KV "
              "from its text (exit status 0); stored at compact alone it fits (2.5 MB): "
              "attach it again with `--levels compact`, or raise the setting "
              "storage_budget_gb")

    class Small(FakeEngine):
        def attach(self, path, **options) -> AttachResult:
            return AttachResult(doc_id=1, title="zeta.md", tokens=800, kept_tokens=800,
                                prefill_s=1.0, encode_s=0.2, raw_bytes=20_000_000,
                                stored_bytes={"high": 0, "balanced": 0, "compact": 0},
                                warnings=["this cache (10.4 MB ...) is larger than the whole "
                                          "storage budget of 5.0 MB: it is not stored", advice])

    fake_app(lambda: Small([], "stop"))
    (tmp_path / "zeta.md").write_text("z")
    result = CliRunner().invoke(cli, ["--data-dir", str(tmp_path / "data"), "attach",
                                      "--no-server", str(tmp_path / "zeta.md")])
    assert result.exit_code == 0, (result.output, result.exception)
    assert "not stored" in result.stdout and f"Warning: {advice}" in result.stderr
    assert "calibrate" not in result.output and "codec:" not in result.stdout


def test_a_cache_no_level_of_which_fits_is_told_the_budget_that_would_hold_it():
    from desktop_app.kv.evictions import fitting

    record = {"entry": 4, "document_id": 1, "chat_id": None, "passage": False,
              "bytes": 9_000_000, "too_large": True,
              "level_bytes": {"high": 4_000_000, "balanced": 3_000_000, "compact": 2_000_000}}
    (said,) = fitting([record], 1_000_000)
    assert said.endswith("not even its smallest level fits (compact, 2.0 MB): a setting "
                         "storage_budget_gb of at least 0.002 stores it at `--levels compact`")
    assert "stored at balanced, compact alone it fits (5.0 MB)" in fitting([record], 5_000_000)[0]
    assert fitting([{**record, "beside": 1}], 5_000_000) == []  # (not the whole budget's)


def test_a_full_chat_is_refused_naming_the_command_that_goes_on(fake_app, tmp_path, capsys,
                                                               monkeypatch):
    """The refusal (probe117 F1) names the command that starts a new chat over the same
    documents (`ask` takes them, not a chat to carry on)."""
    from desktop_app.cli import main

    monkeypatch.setattr(base, "error_line", lambda e: f"Error: {e}")  # (no store warned of)

    class Full(FakeEngine):
        def ask(self, question, **options):
            raise ChatFullError("the chat is full: 8,202 tokens of a 8,192-token context; "
                                "start a new chat over the same documents", (2, 5))

    fake_app(lambda: Full([], "stop"))
    with pytest.raises(SystemExit) as ended:
        main(["--data-dir", str(tmp_path / "data"), "ask", "--chat", "3", "--no-server",
              "And then?"])
    assert ended.value.code == 1
    assert capsys.readouterr().err.strip() == (
        "Error: the chat is full: 8,202 tokens of a 8,192-token context; start a new chat over "
        "the same documents: `kvdesk ask --doc 2 --doc 5 QUESTION`")


def test_a_dumb_terminal_gets_progress_lines_with_no_escape_sequence(capsys, monkeypatch):
    """(Emacs' shell, TERM=dumb, showed "^M^[[K" before every progress line.)"""
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    monkeypatch.setenv("TERM", "dumb")
    progress = base.TerminalProgress()
    for done in range(5):
        progress(Progress("prefill", done, 4))
    base.say(["a note"])
    progress.done()
    assert capsys.readouterr().err == "".join(
        f"prefill {p:3d}% ({d}/4)\n" for d, p in [(0, 0), (1, 25), (2, 50), (3, 75), (4, 100)]
    ) + "Note: a note\n"


@pytest.mark.parametrize("as_json", [False, True])
def test_memory_that_runs_out_mid_work_is_one_error_line_never_a_traceback(
        monkeypatch, capsys, as_json):
    """(Under `prlimit --as=1.5G` an ask's passage encoding printed numpy's 40-line
    traceback, "_ArrayMemoryError: Unable to allocate 133. MiB for an array with shape...".)"""
    from desktop_app.cli import commands

    def short_of_memory(**kwargs):
        raise MemoryError("Unable to allocate 133. MiB for an array with shape (34152, 4096) "
                          "and data type uint8")

    monkeypatch.setattr(commands.cli, "main", short_of_memory)
    with pytest.raises(SystemExit) as ended:
        commands.main(["docs", *(["--json"] if as_json else [])])
    out, err = capsys.readouterr()
    said = ("not enough memory for this work (133 MiB could not be allocated): close other "
            "programs, or give kvdesk a smaller context (--n-ctx, below what `kvdesk info` "
            "shows); what was stored before it is kept")
    assert ended.value.code == 1 and err == f"Error: {said}\n"
    assert (json.loads(out) if as_json else out) == (
        {"error": said, "kind": "MemoryError"} if as_json else "")
