"""Ollama's way with a conversation longer than the context (`server.ollama.fitted`): which
messages are left out, and how few times a long history is measured to find how many. No
model: the completion is a stand-in that refuses what does not fit (test_server_ollama.py
sends a real one through the server)."""

from __future__ import annotations

import pytest

from desktop_app.errors import ContextFullError
from desktop_app.results import Completion, RestoreReport
from desktop_app.server.ollama import fitted


def answered(messages):
    return Completion("ok", "stop", 1, 1, 0.1, RestoreReport(1, 0, 0, [], 0), 0, False,
                      [" ".join(m["content"] for m in messages)])


def fits(most):
    """A completion that refuses more than `most` messages."""
    def complete(messages, _room):
        if len(messages) > most:
            raise ContextFullError("too long")
        return answered(messages)
    return complete


def test_what_is_left_out_of_a_conversation_too_long_for_the_context():
    """Whole turns, oldest first; never a system message, the last message, or the question
    an assistant's last message (a prefill) continues."""
    def said(messages, most):
        return fitted(fits(most), [{"role": r, "content": c} for r, c in messages]).messages

    chat = [("system", "S"), ("user", "u1"), ("assistant", "a1"), ("user", "u2"),
            ("assistant", "a2"), ("user", "u3")]
    assert said(chat, 6) == ["S u1 a1 u2 a2 u3"]
    note, kept = said(chat, 4)
    assert "2 oldest message(s) were left out" in note and kept == "S u2 a2 u3"
    prefill = chat[:5]  # the last message an answer's start, continuing u2
    assert said(prefill, 3)[1] == "S u2 a2"
    with pytest.raises(ContextFullError):
        said(prefill, 2)


def test_a_long_history_is_measured_a_few_times_not_once_a_turn_left_out():
    """Each refusal says how many tokens too many and what each message holds, so `fitted`
    leaves out enough turns at once, and the same turns as leaving them out one by one."""
    def tokens(m):
        return 4 + len(m["content"].split())  # 4: the template's share

    def budget(room, measured):
        tries = []

        def complete(messages, _room):
            tries.append(len(messages))
            total = sum(tokens(m) for m in messages)
            if total > room:
                raise ContextFullError("too long", over=total - room if measured else 0,
                                       sizes=tuple(tokens(m) for m in messages)
                                       if measured else ())
            return answered(messages)
        return complete, tries

    history = [{"role": "system", "content": "S"}] + [
        {"role": r, "content": f"{r[0]}{i} " + "word " * (i * 7 % 23)}
        for i in range(150) for r in ("user", "assistant")] + [
        {"role": "user", "content": "last " * 30}]
    for room in (2000, 400, 60):
        one_by_one, slow = budget(room, measured=False)
        at_once, fast = budget(room, measured=True)
        assert fitted(at_once, history).messages == fitted(one_by_one, history).messages
        assert len(fast) <= 2 < len(slow)


def test_what_is_left_out_leaves_room_for_the_answer():
    """kvdesk's context does not shift as Ollama's does: a history filling it would leave the
    answer a few tokens. Enough goes for the answer's room too; what is left when nothing
    more may go is answered with the room there is."""
    def context(n, answer=4):  # of n tokens, one a message
        def complete(messages, leave_room):
            room = answer if leave_room else 0
            if len(messages) + 1 + room >= n:
                raise ContextFullError("too long", over=len(messages) + 2 + room - n,
                                       sizes=(1.0,) * len(messages))
            return answered(messages)
        return complete

    chat = [{"role": "system", "content": "S"}] + [
        {"role": r, "content": f"{r[0]}{i}"} for i in range(4) for r in ("user", "assistant")
    ] + [{"role": "user", "content": "q"}]
    assert fitted(context(16), chat).messages == [" ".join(m["content"] for m in chat)]
    note, kept = fitted(context(12), chat).messages  # 10 + 1 fit, not with 4 more
    assert kept == "S u2 a2 u3 a3 q"  # 6 + 1 + 4 < 12
    assert "with room for the answer, is longer than the context: its 4 oldest" in note
    (alone,) = fitted(context(12, answer=10), chat[:1] + chat[-1:]).messages  # no more may go
    assert alone == "S q"
    with pytest.raises(ContextFullError):  # too long with no room at all: refused
        fitted(context(3), chat[:1] + chat[-1:])


def test_an_agents_question_is_kept_with_its_calls_and_their_results():
    """A tool's result is written as a user message (`tools.written`): the question kept is
    the client's own, and the call and result after it, the oldest turns going first."""
    agent = [{"role": "system", "content": "S"}, {"role": "user", "content": "u1"},
             {"role": "assistant", "content": "a1"}, {"role": "user", "content": "Q"},
             {"role": "assistant", "content": "call"},
             {"role": "user", "content": "Tool result: 18 C"}]
    assert fitted(fits(4), agent, question=3).messages[1] == "S Q call Tool result: 18 C"
    with pytest.raises(ContextFullError):
        fitted(fits(3), agent, question=3)


def test_a_growing_conversation_is_cut_at_the_same_message_until_it_fills_again():
    """Left out just enough, each turn's window would start a message later, and no stored
    prefix would reach past the system prompt. A block at a time, at cuts that stay where
    they are as the conversation grows (each measured by the text before it, with no state
    kept between requests): each turn's window extends the last one's, but at a new cut,
    after which the window holds about half the context."""
    n_ctx, room = 600, 20

    def complete(messages, leave_room):
        sizes = tuple(4.0 + len(m["content"].split()) for m in messages)  # 4: the template
        over = int(sum(sizes)) + 2 + (room if leave_room else 0) - n_ctx
        if over > 0:
            raise ContextFullError("too long", over=over, sizes=sizes,
                                   own=tuple(len(m["content"].split()) for m in messages),
                                   space=n_ctx)
        return answered(messages)

    history, windows, cut_at = [{"role": "system", "content": "S"}], [], []
    for i in range(60):
        history.append({"role": "user", "content": f"u{i} " + "word " * (5 + i * 7 % 13)})
        said = fitted(complete, history).messages
        windows.append(said[-1].split())
        if len(said) > 1:
            cut_at.append(i)
        history.append({"role": "assistant", "content": f"a{i} " + "word " * 9})
    assert cut_at and cut_at[0] > 10  # (it fitted whole before)
    cuts = [i for i in range(1, len(windows)) if windows[i][:len(windows[i - 1])] !=
            windows[i - 1]]
    assert 2 <= len(cuts) <= 4, cuts  # not a new start each turn past the context
    for i in cuts:  # each cut leaves the window about half the context (its words here)
        assert len(windows[i]) < n_ctx // 2 < len(windows[i - 1]), i
    again = fitted(complete, history[:2 * cuts[-1] + 2]).messages[-1].split()
    assert again == windows[cuts[-1]]  # (the same request, the same cut: no state)
