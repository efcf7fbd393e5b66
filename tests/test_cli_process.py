"""`kvdesk` as a process (`desktop_app.cli.run`): it ends without Python's teardown, yet with
the status, output and exit functions of a normal exit."""

import subprocess
import sys

import pytest

# A stand-in command: it writes unflushed output and a log line, registers an exit function
# (as a command's imports do: numba's, tempfile's), then ends as told.
_SCRIPT = """
import atexit, logging, sys, tempfile, pathlib
import desktop_app.cli as cli
out = pathlib.Path(sys.argv[1])
def main():
    logging.basicConfig(filename=out / "log.txt", level=logging.INFO)
    logging.getLogger("t").info("logged")
    kept = tempfile.TemporaryDirectory()  # removed by a weakref finalizer at exit
    (out / "tmp.txt").write_text(kept.name)
    atexit.register(lambda: (out / "exit.txt").write_text("ran"))
    sys.stdout.write("partial line, unflushed")
    how = sys.argv[2]
    if how == "raise":
        raise RuntimeError("a bug")
    if how != "return":
        sys.exit(int(how) if how.isdigit() else how)
class TornDown:  # freed in Python's teardown, which `run` skips
    def __del__(self):
        (out / "teardown.txt").write_text("ran")
held = TornDown()
cli.main = main
cli.run()
"""


@pytest.mark.parametrize("how,status", [("return", 0), ("0", 0), ("3", 3), ("a message", 1),
                                        ("raise", 1)])
def test_run_exits_with_a_normal_exits_status_output_and_exit_functions(tmp_path, how, status):
    done = subprocess.run([sys.executable, "-c", _SCRIPT, str(tmp_path), how],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == status, done.stderr
    assert done.stdout == "partial line, unflushed"
    assert (tmp_path / "exit.txt").read_text() == "ran"
    assert "logged" in (tmp_path / "log.txt").read_text()
    assert not __import__("pathlib").Path((tmp_path / "tmp.txt").read_text()).exists()
    assert not (tmp_path / "teardown.txt").exists()  # the teardown was skipped
    if how == "raise":
        assert "RuntimeError: a bug" in done.stderr
    if how == "a message":
        assert "a message" in done.stderr


def test_main_called_in_a_process_leaves_it_running():
    """Only `run` ends a process: `main` called by a program returns to it (here: a usage
    error's SystemExit, caught)."""
    code = ("import desktop_app.cli as c\ntry:\n    c.main(['--bogus'])\nexcept SystemExit as e:\n"
            "    print('still here', e.code)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "still here 1", done.stderr
