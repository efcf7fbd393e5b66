"""The codec in the status bar: its kernels being prepared, and its calibration for the model.

A mixin of `MainWindow` (ui.main_window), which calls `_build_codec_status` while it builds
itself, `_watch_codec` once the engine is loaded and `_maybe_calibrate` whenever the
documents or the settings change.

Preparing: while the engine readies the codec's kernels (`warm_up`), `engine.codec_state()` is
polled; while they compile (20-60 s where the shipped kernel cache does not fit the CPU) a
status-bar label says how far it is and how long it should take. Nothing waits for it: a
question asked meanwhile waits or recomputes inside the engine, which says which in its
restore messages. A failed preparation is a short note: the codec then compiles on first use.

Calibrating: with the setting `calibrate_automatically` on, a model that has no codec
calibration is calibrated once the kernels are ready and there is a document (at start, or
after the first attach), on its own worker lane, at most once per window: a window lives for
one model (changing it builds a new window), so at most once per model per session, and a
cancel is final until the user asks again from the Tools menu. Questions keep working
meanwhile: the engine calibrates in its own model contexts. A calibrated model whose documents
were cached before its calibration (one stopped partway, or made by another process) has them
moved to its levels instead (`Engine.relevel`), shown as the calibration's last stage.

It never calls the engine on the GUI thread and never opens a dialog.
"""

from __future__ import annotations

from PySide6.QtCore import QTimer, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QHBoxLayout, QLabel, QProgressBar, QPushButton, QWidget

from desktop_app.results import COMPILING, FAILED, CalibrationInfo, PrepState, Progress

from ..text.formatting import calibrating_line, calibration_line, prep_line

PREP_POLL_MS = 250
# A document's cache levels (`DocumentInfo.levels`) that a calibrated model's are moved from.
MOVED = ("model-independent", "lossless-until-calibrated")
# `warm_up` starts the preparation on a thread of its own, so the first looks may still find
# it idle; an engine that never warms up stays idle, and is looked at this many times only.
IDLE_POLLS = 20


class CalibrationBar(QWidget):
    """The running calibration in the status bar: its stage and percent, and a Cancel button."""

    cancel_clicked = Signal()

    def __init__(self):
        super().__init__(visible=False)
        self.label = QLabel()
        self.bar = QProgressBar(maximum=100, textVisible=False, maximumWidth=90,
                                maximumHeight=12)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop calibrating: what it measured is kept for its "
                                      "next run, and new caches keep the levels they use now")
        self.cancel_button.clicked.connect(self.cancel_clicked)
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.label)
        row.addWidget(self.bar)
        row.addWidget(self.cancel_button)

    def begin(self) -> None:
        self.label.setText("Calibrating the codec for this model… starting")
        self.bar.setValue(0)
        self.cancel_button.setEnabled(True)
        self.show()

    def show_progress(self, p: Progress) -> None:
        if self.cancel_button.isEnabled():  # once cancelling, it says so until it stops
            self.label.setText(calibrating_line(p))
            self.label.setToolTip(p.note)  # a run going on from a stopped one: what it kept
            self.bar.setValue(100 * p.done // p.total if p.total else 0)

    def cancelling(self) -> None:
        self.label.setText("Cancelling the calibration…")
        self.cancel_button.setEnabled(False)


class CodecMixin:
    def _build_codec_status(self) -> None:
        self.prep_label = QLabel(visible=False)
        self.statusBar().addPermanentWidget(self.prep_label)
        self.calibration_bar = CalibrationBar()
        self.statusBar().addPermanentWidget(self.calibration_bar)
        self.calibration_bar.cancel_clicked.connect(self.cancel_calibration)
        self.prep_timer = QTimer(self, singleShot=True, interval=PREP_POLL_MS)
        self.prep_timer.timeout.connect(self._poll_codec)
        self.calibrate_action = QAction("&Calibrate the codec for this model", self,
                                        enabled=False)
        self.calibrate_action.triggered.connect(self.calibrate_codec)
        self.menuBar().addMenu("&Tools").addAction(self.calibrate_action)
        self.codec_busy = True  # until a look says otherwise; calibrating waits for it
        self._idle_polls = 0
        # The model's calibration, once read (calibration_known); None: model-independent.
        self.calibration_info: CalibrationInfo | None = None
        self.calibration_known = False
        self.calibration_job = None
        self._calibration_tried = False  # begun in this window: never again automatically

    # -- preparing the codec's kernels ------------------------------------------------------

    def _watch_codec(self) -> None:
        engine = self.engine
        self.calibrate_action.setEnabled(True)
        self.runner.start("misc", lambda job: engine.calibration(),
                          finished=self._calibration_read,
                          failed=lambda msg: self.statusBar().showMessage(
                              f"The model's codec calibration could not be read: {msg}", 15000))
        self._poll_codec()

    def _poll_codec(self) -> None:
        engine = self.engine
        # A failed look (an engine bug) ends the watch: the codec still works, unannounced.
        self.runner.start("misc", lambda job: engine.codec_state(),
                          finished=self._show_codec_state,
                          failed=lambda msg: self._codec_settled())

    def _show_codec_state(self, state: PrepState) -> None:
        self.prep_label.setVisible(state.phase == COMPILING)
        if state.phase == COMPILING:
            self.prep_label.setText(prep_line(state))
            self.prep_label.setToolTip("Compiling the codec's kernels for this computer; "
                                       "this happens once. Questions are answered meanwhile.")
        self._idle_polls = self._idle_polls + 1 if state.phase == "idle" else 0
        if state.busy or 0 < self._idle_polls < IDLE_POLLS:
            self.prep_timer.start()
            return
        if state.phase == FAILED:
            reason = (state.error or "unknown error").splitlines()[0]
            self.statusBar().showMessage(f"The codec could not be prepared in advance "
                                         f"({reason}); it compiles when first used", 15000)
        self._codec_settled()

    def _codec_settled(self) -> None:
        self.prep_label.hide()
        self.codec_busy = False
        self._maybe_calibrate()

    # -- calibrating the codec for the model ------------------------------------------------

    def _calibration_read(self, info: CalibrationInfo | None) -> None:
        self.calibration_info, self.calibration_known = info, True
        self._maybe_calibrate()

    def _maybe_calibrate(self) -> None:
        """Calibrate in the background if the settings ask for it and nothing stands in the
        way; a calibrated model's documents cached before its calibration are moved to its
        levels instead (what a calibration stopped, or another process's, left)."""
        if not (self.settings.calibrate_automatically and self.calibration_known
                and not self._calibration_tried and not self.codec_busy and self.documents):
            return
        if self.calibration_info is None:
            self.calibrate_codec()
        elif any(d.levels in MOVED for d in self.documents):
            engine = self.engine
            self._calibration_job(lambda job: engine.relevel(
                progress=job.signals.progress.emit, cancel=job.cancel), self._moved)

    def calibrate_codec(self) -> None:
        """Calibrate the codec for the loaded model, in the background (the Tools menu)."""
        engine = self.engine
        self._calibration_job(lambda job: engine.calibrate(
            progress=job.signals.progress.emit, cancel=job.cancel), self._calibrated)

    def _calibration_job(self, work, finished) -> None:
        if self.engine is None or self.calibration_job is not None:
            return
        self._calibration_tried = True
        job = self.runner.start("calibrate", work, finished=finished,
                                failed=self._calibration_failed,
                                progress=self.calibration_bar.show_progress,
                                cancelled=self._calibration_cancelled)
        self.calibration_job = job
        self.calibration_bar.begin()
        self.calibrate_action.setEnabled(False)

    def cancel_calibration(self) -> None:
        if self.calibration_job is not None:
            self.calibration_job.cancel.set()
            self.calibration_bar.cancelling()

    def _calibration_over(self, message: str, outcome: object) -> None:
        self.calibration_job = None
        self.calibration_bar.hide()
        self.calibrate_action.setEnabled(True)
        self.statusBar().showMessage(message, 15000)
        self.calibration_done.emit(outcome)

    def _calibrated(self, info: CalibrationInfo) -> None:
        self.calibration_info, self.calibration_known = info, True
        self._calibration_over("Codec calibrated: new caches use the model's own levels", info)
        if any(d.levels in MOVED for d in self.documents):  # (moved now: their tooltips)
            self.refresh_documents()

    def _moved(self, report: dict) -> None:
        left = (f"; stopped ({report['stopped']}): {report['left']} left for the next start"
                if report["stopped"] else "")
        self._calibration_over(f"{report['entries']} cache(s) stored before the calibration "
                               f"moved to its levels{left}", report)
        if report["entries"]:
            self.refresh_documents()

    def _calibration_cancelled(self) -> None:
        kept = "its earlier calibration" if self.calibration_info else "model-independent levels"
        # (the next start calibrates again, the setting being on: said, so it is no surprise)
        again = ("; it starts again when the app does (Settings: \"Calibrate it for each "
                 "model automatically\")"
                 if self.settings.calibrate_automatically and not self.calibration_info else "")
        self._calibration_over(f"Calibration cancelled: new caches keep {kept}{again}",
                               "cancelled")

    def _calibration_failed(self, message: str) -> None:
        self._calibration_over(f"The codec could not be calibrated: {message}", message)

    def codec_levels_line(self) -> str:
        """Which codec levels the model's new caches use, for the settings ("" before known)."""
        if not self.calibration_known:
            return ""
        line = calibration_line(self.calibration_info)
        return line + ("; calibrating it now…" if self.calibration_job is not None else "")
