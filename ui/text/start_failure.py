"""What the window says when it starts without an engine: the status line, the chat list's
and the documents pane's notes.

A model that will not load and a data folder whose store cannot be opened are told apart
(`desktop_app.errors.data_folder_fault`): Settings can fix the first, while the second is
the folder's own problem, which choosing another folder only steps around. It never tells
the user to move, delete or overwrite the folder: its chats and documents may be the only
copy.
"""

from __future__ import annotations

from pathlib import Path

ELSEWHERE = ("another data folder in Settings (Ctrl+,): this one's chats and documents "
             "stay in it as they are.")


def start_failure(message: str, fault: str | None, folder: Path) -> tuple[str, str, str, str]:
    """(heading, status line, chat list's note, documents pane's note) for a start that failed
    with `message`; `fault`: `data_folder_fault`'s word for it, None for the model's failure.
    The heading stands where the conversation would, in place of the welcome's attach hint."""
    if fault is None:
        return ("No model is loaded",
                f"The model could not be loaded: {message}. Check Settings (Ctrl+,).",
                f"Your chats and documents are kept in {folder}; they show here once a model "
                "loads (Settings, Ctrl+,).",
                "Attaching needs a model loaded.")
    if fault == "version":
        what = ("A newer kvdesk last used it (or it holds something other than a kvdesk "
                "store); nothing in it was changed. Open it with that kvdesk, or restore a "
                f"backup of the folder; or choose {ELSEWHERE}")
    else:  # (the store's message says what is wrong with the folder, and what to do)
        what = f"Nothing in it was changed. You can also choose {ELSEWHERE}"
    return ("The data folder cannot be opened",
            f"This kvdesk cannot open its data folder, {folder}: {message}. {what}",
            f"Your chats and documents are kept in {folder}, which this kvdesk cannot open: "
            "they are not shown here, and nothing there was changed.",
            "Attaching needs a data folder this kvdesk can open.")
