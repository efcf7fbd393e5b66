"""Numbers and engine reports as the short phrases the window shows people.

Pure functions over `desktop_app.results` records: no Qt, no engine calls.
"""

from __future__ import annotations

import re

from desktop_app.results import (
    FINISH_WORDS,
    PASSAGES_AS_TEXT,
    AskResult,
    AttachResult,
    CalibrationInfo,
    PrepState,
    Progress,
    RestoreReport,
    restore_phrase,
)

# The stages of a codec calibration (desktop_app.calibration.calibrate); the others are level names.
CALIBRATION_STAGES = {"reference": "measuring the model's own cache",
                      "transforms": "fitting the transforms",
                      "sensitivity": "measuring each part's sensitivity", "done": "saving",
                      "waiting": "waiting for another kvdesk process calibrating it",
                      "relevel": "moving the caches stored before it to its levels"}


def shortened(text: str, limit: int = 100) -> str:
    """A title or list cut to `limit` characters (… at the cut): a label's text never widens
    the window beyond the screen (the whole text goes in its tooltip)."""
    return text if len(text) <= limit else text[:limit - 1].rstrip() + "…"


def file_name(title: str, limit: int = 80) -> str:
    """A title as a file name every system takes: no path separators, reserved or control
    characters, no leading dot, at most `limit` characters; "chat" when nothing is left."""
    name = re.sub(r'[<>:"/\\|?*\x00-\x1f]+', " ", title)
    name = " ".join(name.split()).lstrip(".")[:limit].rstrip(" .")
    return name or "chat"


# The engine's notes give their advice as CLI commands in backticks (the CLI, the local API
# and the window show the same notes); the window names its own place for each command it
# has one for, and shows the others without the backticks of a terminal's literal text.
WINDOW_TERMS = {"kvdesk calibrate": "Tools ▸ Calibrate the codec for this model",
                "kvdesk calibrate --force": "Tools ▸ Calibrate the codec for this model",
                "kvdesk docs": "the Documents list", "kvdesk attach": "File ▸ Attach documents"}


def in_window_terms(note: str) -> str:
    """A note of the engine's with its CLI advice said in the window's terms: "calibrate it
    with `kvdesk calibrate`" reads "calibrate it with Tools ▸ Calibrate the codec for this
    model"."""
    return re.sub(r"`([^`\n]+)`", lambda m: WINDOW_TERMS.get(m[1], m[1]), note)


def notes_text(notes: list[str]) -> str:
    """Several notes as the window shows them: each on a line of its own, in window terms."""
    return "\n".join(in_window_terms(n) for n in notes if n)


def restore_line(report: RestoreReport) -> str:
    """E.g. "restored 4,096 tokens in 120 ms — 16 chunks: 14 high, 2 balanced" (`restore_phrase`),
    whether the context is exact or blended, and the restore's notes."""
    line = restore_phrase(report)
    blended = report.blended or {}
    if blended.get("mode") == "exact":
        line += " · exact context"
    elif blended.get("mode") == "blended":
        line += " · blended from the documents' caches (approximate; made exact in the background)"
    return notes_text([line, *report.messages])


def answer_stats(result: AskResult, generation_s: float) -> str:
    """E.g. "48 tokens · 31.2 tokens/s · first token after 0.12 s" (and "· stopped at the
    token limit: it may be cut short" when it ran to max_tokens or the context's end)."""
    return answer_note(result.as_dict(), generation_s)


def answer_note(stats: dict, generation_s: float | None = None) -> str:
    """The note under an answer, from its AskResult's fields (`stats`, as a chat stores
    them). A stored answer (no `generation_s`) says what stays true of it: its length, why it
    stopped and the model that gave it; its speed was the machine's at the time, and its
    notes, said in the status bar as it ended, were mostly of that restore's (levels read,
    chunks computed)."""
    tokens = stats.get("tokens_generated")
    parts = [f"{tokens:,} tokens"] if tokens is not None else []
    if generation_s is not None:
        rate = (tokens or 0) / generation_s if generation_s > 0 else 0.0
        parts += [f"{rate:.1f} tokens/s", f"first token after {stats.get('ttft_s', 0.0):.2f} s"]
    parts += [FINISH_WORDS.get(stats.get("finish_reason"), ""), stats.get("model", "")]
    return " · ".join(p for p in parts if p)


def attach_notices(result: AttachResult) -> list[str]:
    """What the user should know about a document that was attached."""
    notices = list(result.warnings)
    if result.kept_tokens < result.tokens and not result.passages:
        notices.append(f"{result.title}: only the first {result.kept_tokens:,} of "
                       f"{result.tokens:,} tokens fit the context; the rest is left out")
    return notices


def as_text_note(title: str, automatic: bool) -> str:
    """What an attach says of a long document under a model that keeps no passage KV until
    its codec is calibrated (`EngineAPI.passages_as_text`), and what the window does about
    it: calibrates by itself after an attach (`automatic`: the setting), else where to."""
    return f"{title}: {PASSAGES_AS_TEXT}; " + (
        "the window calibrates it in the background now (a few minutes, once)" if automatic
        else "Tools ▸ Calibrate the codec for this model (a few minutes, once)")


def prep_line(state: PrepState) -> str:
    """E.g. "Preparing the codec (once)… 40%, about 12 s left" ("almost done" under a
    second: the estimate is the kernels left, which can all be running)."""
    left = f"about {state.left_s:.0f} s left" if state.left_s >= 0.5 else "almost done"
    return f"Preparing the codec (once)… {state.fraction * 100:.0f}%, {left}"


# A document's cache levels (`DocumentInfo.levels`) as its row's tooltip says them.
LEVEL_LINES = {"calibrated": "Cached at the model's calibrated levels",
               "model-independent": "Cached at model-independent levels: moved to the "
                                    "model's calibrated levels once it is calibrated",
               "lossless-until-calibrated": "Cached lossless only until the codec is "
                                            "calibrated for this model",
               "lossless": "Cached lossless only"}


def calibrating_line(p: Progress) -> str:
    """E.g. "Calibrating the codec for this model… fitting balanced 65%" (no "0%": the first
    stage, the model's own cache measured, says nothing of its progress for a minute or so)."""
    stage = CALIBRATION_STAGES.get(p.title, f"fitting {p.title}" if p.title else "")
    percent = 100 * p.done // p.total if p.total else 0
    return " ".join(["Calibrating the codec for this model…"] + [stage] * bool(stage)
                    + [f"{percent}%"] * bool(percent)
                    + ["(resumed)"] * bool(p.note and p.title != "waiting"))


def calibration_line(info: CalibrationInfo | None) -> str:
    """Which codec levels the model's new caches use, e.g. "Calibrated for this model
    (3f9a2c1d): high 4.0, balanced 2.5, compact 1.5 bits per value"."""
    if info is None:
        return ("Model-independent levels: this model is not calibrated (Tools ▸ Calibrate "
                "the codec for this model, or `kvdesk calibrate`)")
    bits = ", ".join(f"{level} {facts['bits_per_element']:.1f}"
                     for level, facts in info.levels.items() if "bits_per_element" in facts)
    return (f"Calibrated for this model ({info.id[:8]})"
            + (f": {bits} bits per value" if bits else ""))
