"""The GUI thread never blocks for more than 50 ms while documents compute, chats restore and
answers stream: a 10 ms timer on the GUI thread records the longest gap between its ticks."""

from __future__ import annotations

import time

from PySide6.QtCore import Qt, QTimer
from ui_fixtures import open_window, text_file

from ui.testing import FakeEngine

MAX_GAP_S = 0.050


class GapProbe:
    def __init__(self):
        self.timer = QTimer(interval=10, timerType=Qt.TimerType.PreciseTimer)
        self.timer.timeout.connect(self._tick)
        self.last = None
        self.max_gap = 0.0
        self.ticks = 0

    def _tick(self) -> None:
        now = time.perf_counter()
        if self.last is not None:
            self.max_gap = max(self.max_gap, now - self.last)
        self.last = now
        self.ticks += 1

    def start(self) -> None:
        self.last = None
        self.timer.start()


def test_the_gui_thread_stays_responsive(qtbot, tmp_path):
    # Pauses like the real engine's: 30 ms progress steps, 10 ms per token.
    engine = FakeEngine(step_s=0.03, token_s=0.01).seed()
    window = open_window(qtbot, engine)
    with qtbot.waitExposed(window):
        window.show()  # the first paint is not measured: it happens once, before any work
    # Asked before the probe starts: the fake engine's calls sleep like real ones, and this
    # one would run on the GUI thread, where the window itself never calls the engine.
    oldest_chat = engine.chats()[-1].chat_id
    probe = GapProbe()
    probe.start()

    attached = []
    window.attach_done.connect(attached.append)
    window.attach_files([text_file(tmp_path, "long.txt", 3000), text_file(tmp_path, "b.md")])
    # Chat while the documents compute: a new answer, then a reopened chat and another answer.
    with qtbot.waitSignal(window.answer_done, timeout=10000):
        window.send("What does the paper say?")
    with qtbot.waitSignal(window.restored, timeout=10000):
        window.open_chat(oldest_chat)
    with qtbot.waitSignal(window.answer_done, timeout=10000):
        window.send("And in more detail?")
    qtbot.waitUntil(lambda: len(attached) == 2, timeout=20000)
    probe.timer.stop()

    assert [type(a).__name__ for a in attached] == ["AttachResult", "AttachResult"]
    assert probe.ticks > 50  # the probe really ran throughout
    assert probe.max_gap < MAX_GAP_S, f"the GUI thread blocked for {probe.max_gap * 1000:.0f} ms"
