"""The window's background jobs (`ui.workers`): each one's result reaches its slot, and a job
that has run is freed with all it held."""

from __future__ import annotations

import gc
import weakref

from ui.workers import Runner


def test_a_job_that_has_run_is_freed_with_its_slots_and_its_error(qtbot):
    """(Every job the window ever ran stayed alive until it closed, its slots and a failed
    one's traceback frames too: ~6.5 KB a job, three jobs a click; probe 121.)"""
    runner = Runner()
    got, failed = [], []

    def fail(job):
        raise KeyError("oops")

    jobs = [weakref.ref(runner.start("misc", lambda job, i=i: i, finished=got.append))
            for i in range(30)]
    jobs += [weakref.ref(runner.start("chat", fail, failed=failed.append))]
    qtbot.waitUntil(lambda: len(got) == 30 and failed and not runner.active, timeout=5000)
    runner.shutdown()
    gc.collect()
    assert sorted(got) == list(range(30)) and failed == ["Unexpected error: KeyError: 'oops'"]
    assert [job() for job in jobs] == [None] * 31
