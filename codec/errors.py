"""The exception the codec raises for bad input or bad blobs.

Everything the codec refuses (corrupt, truncated or foreign blobs, non-finite input, wrong
shapes, unknown levels) surfaces as `CodecError`, so callers need a single except clause;
`CalibrationMissing`, one kind of it, says that a blob needs a calibration it was not given.
This module must never import anything else from the package.
"""


class CodecError(ValueError):
    """Input the codec cannot accept, or a blob it cannot decode faithfully."""


class CalibrationMissing(CodecError):
    """A blob (or config) of a calibrated level without the model calibration it names."""

    def __init__(self, calibration_id: str):
        self.calibration_id = calibration_id
        super().__init__(f"this KV chunk was encoded with model calibration "
                         f"{calibration_id[:12]}, which is not available here (calibrate the "
                         f"model again, or fetch the calibration with the chunks)")
