"""The Responses API answering from kvdesk's documents, as chat completions does: the same
`kvdesk` field (documents, level...), checked alike, its result field with the sources, whole
and streamed, and a conversation continued by id reading its documents again."""

from __future__ import annotations

import httpx
import pytest
from test_server import Running

pytestmark = pytest.mark.model

FACT = "Budget line 88-K was approved by Marta Quillfeather on 3 March."
LONG = "\n\n".join(f"## Part {i}\n\nThe quarry at Helmsby shipped {i * 13} tonnes of slate in "
                   f"week {i}, by barge and by rail." for i in range(120))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    running = Running(tmp_path_factory.mktemp("responses"))
    yield running
    running.stop()


def attach(served, name: str, text: str) -> int:
    r = httpx.post(f"{served.url}/v1/kvdesk/documents", timeout=300, trust_env=False,
                   files={"file": (name, text.encode(), "text/plain")})
    assert r.status_code == 200, r.text
    return r.json()["doc_id"]


def respond(served, question: str, **extra):
    return served.client.responses.create(model="default", input=question, temperature=0,
                                          max_output_tokens=8, **extra)


def test_a_response_answers_from_the_documents_named_as_chat_completions_does(served):
    doc = attach(served, "budget.txt", FACT)
    question = "Who approved budget line 88-K?"
    kvdesk = {"documents": [doc], "level": "high"}
    chat = served.client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": question}], max_tokens=8,
        temperature=0, extra_body={"kvdesk": kvdesk})
    one = respond(served, question, extra_body={"kvdesk": kvdesk})
    plain = respond(served, question, store=False)
    # The same prompt as the chat's: the document's cached prefix, then the question.
    assert one.usage.input_tokens == chat.usage.prompt_tokens > plain.usage.input_tokens + 10
    assert one.model_extra["kvdesk"]["restored_tokens"] > 10
    assert one.output_text == chat.choices[0].message.content
    # Continued by id, it reads them again; `"documents": []` asks for none.
    two = respond(served, "And when?", previous_response_id=one.id)
    none = respond(served, "And when?", previous_response_id=one.id,
                   extra_body={"kvdesk": {"documents": []}})
    assert two.usage.input_tokens > none.usage.input_tokens + 10


def test_a_long_documents_sources_come_with_the_response_whole_and_streamed(served):
    doc = attach(served, "quarry.md", LONG)
    question = "How many tonnes did the quarry ship in week 7?"
    whole = respond(served, question, extra_body={"kvdesk": {"documents": [doc]}})
    sources = whole.model_extra["kvdesk"]["sources"]
    assert sources and all(s["document_id"] == doc for s in sources), whole.model_extra["kvdesk"]
    events = list(respond(served, question, stream=True,
                          extra_body={"kvdesk": {"documents": [doc]}}))
    last = events[-1].response
    assert last.model_extra["kvdesk"]["sources"] == sources
    assert served.client.responses.retrieve(last.id).model_extra["kvdesk"]["sources"] == sources


@pytest.mark.parametrize("stream", [False, True])
def test_the_kvdesk_field_is_checked_as_on_chat_completions(served, stream):
    for kvdesk, status, param in (({"documents": [999]}, 404, "kvdesk.documents"),
                                  ({"level": "finest"}, 400, "kvdesk.level"),
                                  ({"docs": [1]}, 400, "kvdesk.docs"),
                                  ({"documents": ["1"]}, 400, "kvdesk.documents.0")):
        r = httpx.post(f"{served.url}/v1/responses", trust_env=False, timeout=60, json={
            "model": "default", "input": "Say hello.", "stream": stream, "kvdesk": kvdesk})
        assert r.status_code == status, r.text
        assert r.json()["error"]["param"] == param, r.text
