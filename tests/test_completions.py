"""Stop strings as an answer streams: never a piece of one sent, the answer cut where the first
begins, whatever the token boundaries."""

from __future__ import annotations

import pytest

from desktop_app.chat.answers import StopStrings, from_first_visible


def run(pieces, stop):
    sent = []
    stops = StopStrings(stop, sent.append)
    stopped_at = next((i for i, p in enumerate(pieces) if stops.feed(p)), None)
    return "".join(sent), stops.finish(), stopped_at


@pytest.mark.parametrize("pieces, stop, sent, text, at", [
    (["Hello", " wor", "ld"], [], "Hello world", "Hello world", None),
    (["Hello", " wor", "ld"], ["END"], "Hello world", "Hello world", None),
    (["One. ", "Two", ". Thr", "ee"], [". Th"], "One. Two", "One. Two", 2),
    (["ab", "c<", "|e", "nd|>", "more"], ["<|end|>"], "abc", "abc", 3),
    (["a<", "b"], ["<|end|>"], "a<b", "a<b", None),  # held back, then released
    (["xSTOPy"], ["STOP", "xS"], "", "", 0),  # the earliest stop string wins
    (["ab", "cd"], ["d", "bc"], "a", "a", 1),
])
def test_stop_strings(pieces, stop, sent, text, at):
    assert run(pieces, stop) == (sent, text, at)


def test_nothing_after_a_stop_is_sent():
    sent = []
    stops = StopStrings(["!"], sent.append)
    assert stops.feed("hi!") and stops.feed("more")
    assert "".join(sent) == "hi" and stops.finish() == "hi"


@pytest.mark.parametrize("pieces, stop, sent, text", [
    ([" ", "\n", " In", " the", "  drawer."], [], "In the  drawer.", " \n In the  drawer."),
    ([" In", " the"], [" the"], "In", " In"),
    (["  "], [], "", "  "),
])
def test_a_chats_answer_is_sent_from_its_first_visible_character(pieces, stop, sent, text):
    got = []
    stops = StopStrings(stop, from_first_visible(got.append))
    for piece in pieces:
        stops.feed(piece)
    # The answer as generated stays whole: the context holds its tokens.
    assert stops.finish() == text and "".join(got) == sent == text.lstrip()
    assert all(got)  # no empty delta
