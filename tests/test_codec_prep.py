"""The codec's background preparation: its observable state, its estimate of the time left,
and the wait-or-recompute choice of a question asked meanwhile
(desktop_app/calibration/codec_prep.py)."""

from __future__ import annotations

import json

import pytest

from desktop_app.calibration import codec_prep
from desktop_app.calibration.codec_prep import CodecPrep, decide, estimate_left_s

SHAPE = (2, 48, 64)


@pytest.mark.parametrize("left, restore, recompute, action, expected", [
    (0.0, 0.2, 9.0, "restore", 0.2),  # ready: restore as usual
    (3.0, 0.5, 9.0, "wait", 3.5),  # the codec is nearly ready: waiting is sooner
    (20.0, 0.5, 9.0, "recompute", 9.0),  # a long compile ahead: recompute from text
    (8.5, 0.5, 9.0, "wait", 9.0),  # a tie waits: the stored KV is what the user kept
    (8.6, 0.5, 9.0, "recompute", 9.0),
])
def test_decide_takes_whichever_is_sooner(left, restore, recompute, action, expected):
    d = decide(prep_left_s=left, restore_s=restore, recompute_s=recompute)
    assert (d.action, d.expected_s) == (action, pytest.approx(expected))
    assert d.reason


def test_decide_says_which_and_why():
    assert decide(prep_left_s=20, restore_s=0.5, recompute_s=9).reason == (
        "recomputed from text (about 9 s) rather than wait about 20 s more for it")
    assert decide(prep_left_s=3.5, restore_s=0.5, recompute_s=9).reason == (
        "waited about 4 s for it to finish (recomputing from text would have taken about 9 s)")


def test_estimate_while_loading_is_the_load_prior():
    names = ["encode a", "decode a", "encode b", "decode b"]
    assert estimate_left_s(names, 0, False, {}, {}, 0.0) == codec_prep.PRIOR_LOAD_S
    assert estimate_left_s(names, 2, False, {}, {}, 0.0) == codec_prep.PRIOR_LOAD_S / 2
    assert estimate_left_s([], 0, True, {}, {}, 0.0) == codec_prep.PRIOR_COMPILE_S


def test_estimate_while_compiling_follows_the_profile_and_this_run():
    names = ["encode a", "decode a", "encode b", "decode b"]
    profile = {"encode a": 6.0, "decode a": 12.0, "encode b": 2.0, "decode b": 0.0}
    # nothing done yet: the profile as it is, less the time the first step has run
    assert estimate_left_s(names, 0, True, profile, {}, 1.0) == pytest.approx(19.0)
    # the first step took twice its expectation: the rest is expected twice as long too
    assert estimate_left_s(names, 1, True, profile, {"encode a": 12.0}, 4.0) == \
        pytest.approx(2 * 12 - 4 + 2 * 2)
    # a step running past its expectation counts as due now, not as negative time
    assert estimate_left_s(names, 3, True, profile, {"encode a": 6, "decode a": 12,
                                                     "encode b": 2}, 5.0) == 0.0
    # without a profile: the compile prior spread over the steps
    per = codec_prep.PRIOR_COMPILE_S / 4
    assert estimate_left_s(names, 0, True, {}, {}, 0.0) == pytest.approx(4 * per)
    assert estimate_left_s(names, 4, True, profile, {}, 0.0) == 0.0


def test_preparation_reports_progress_then_ready(tmp_path, monkeypatch):
    monkeypatch.setattr(codec_prep.jitcache, "stamp_path", lambda: tmp_path / "stamp.json")
    seen = []
    profile = tmp_path / "codec-prep.json"
    prep = CodecPrep(SHAPE, ["balanced", "lossless"], profile_path=profile,
                     on_change=seen.append)
    assert prep.state().phase == "idle" and not prep.state().busy
    prep.start()
    prep.start()  # once
    assert prep.wait(timeout=600)
    prep.join()
    state = prep.state()
    assert state.phase == "ready" and not state.busy and state.error is None
    assert (state.done, state.total, state.left_s, state.fraction) == (6, 6, 0.0, 1.0)
    steps = [s.step for s in seen if s.busy]
    assert steps[:6] == ["encode balanced", "decode balanced", "encode lossless",
                         "decode lossless", "calibrated levels", "stamp"]
    # its last step: every kernel of those levels is known to be cached
    assert codec_prep.jitcache.kernels_cached(["balanced", "lossless"])
    assert [s.done for s in seen if s.busy] == sorted(s.done for s in seen if s.busy)
    assert seen[-1].phase == "ready"
    # a profile is written only when something had to be compiled
    assert profile.exists() == (state.compiled > 0)
    if profile.exists():  # every step it ran, timed
        assert set(json.loads(profile.read_text())["steps"]) == set(steps)


def test_a_failing_preparation_is_reported_not_raised(tmp_path):
    bad_profile = tmp_path / "profile.json"
    bad_profile.write_text("{not json")
    prep = CodecPrep((0, 0, 0), ["balanced"], profile_path=bad_profile)
    prep.start()
    assert prep.wait(timeout=60)
    state = prep.state()
    assert state.phase == "failed" and not state.busy and state.left_s == 0.0
    assert "Error: " in state.error.splitlines()[0]


def test_a_stopped_preparation_ends_at_its_next_step_and_says_so(tmp_path):
    """A one-shot command closes as soon as it has answered: the steps it never needed are
    not run while it waits to exit."""
    seen, preps = [], []

    def on_change(state):
        seen.append(state.step)
        if state.done == 1:
            preps[0].stop()

    prep = CodecPrep(SHAPE, ["balanced", "lossless"], profile_path=tmp_path / "p.json",
                     on_change=on_change)
    preps.append(prep)
    prep.start()
    assert prep.wait(timeout=600)
    prep.join()
    state = prep.state()
    assert state.phase == "failed" and "closing" in state.error
    assert state.done < state.total
    assert "decode lossless" not in seen
    assert not (tmp_path / "p.json").exists()  # a partial run is no profile


def test_run_steps_stops_before_the_next_step_when_cancelled():
    import threading

    from codec import precompile

    ran = []
    cancel = threading.Event()
    todo = [precompile.Step(name, lambda name=name: (ran.append(name),
                                                     name == "b" and cancel.set()))
            for name in "abc"]
    took = precompile.run_steps(todo, cancel=cancel)
    assert ran == ["a", "b"] and list(took) == ["a", "b"]


def test_run_steps_asks_pause_before_each_step_and_stops_if_cancelled_meanwhile():
    """The engine's restores go first: `pause` holds each step back until it returns, and a
    cancel set while it waited stops the run there."""
    import threading

    from codec import precompile

    events, cancel = [], threading.Event()

    def pause():
        events.append("pause")
        if events.count("pause") == 3:
            cancel.set()  # the app closed while the step waited

    todo = [precompile.Step(name, lambda name=name: events.append(name)) for name in "abc"]
    took = precompile.run_steps(todo, cancel=cancel, pause=pause)
    assert events == ["pause", "a", "pause", "b", "pause"] and list(took) == ["a", "b"]
