"""The Qt binding itself: guards against a known-bad PySide6 release coming back in."""

from __future__ import annotations

import sys


def test_void_calls_do_not_leak_references_to_none(qtbot):
    # PySide6 6.12 drops a reference to None on each void call; Python 3.11 then aborts after
    # a few thousand calls (pyproject pins PySide6-Essentials below 6.12 for this).
    from PySide6.QtWidgets import QPushButton

    button = QPushButton()
    qtbot.addWidget(button)
    before = sys.getrefcount(None)
    for _ in range(200):
        button.setEnabled(True)
    assert sys.getrefcount(None) - before > -50
