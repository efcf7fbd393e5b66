"""Tool calling's Python API (`desktop_app.tools`) on the default model's vocabulary: the
grammar "auto" holds an answer to admits text or a whole call of an offered tool (its
arguments as its schema says), never the start of a call gone astray, and "required" only
calls; an answer is read into calls and a history written back as the model wrote it; a
streamed answer is held back only while it may still be a call. (On the local API:
tests/test_server_tools.py.)"""

from __future__ import annotations

import ctypes
import re

import llama_cpp
import numpy as np
import pytest
from llama_cpp import _internals

from desktop_app.model import answerformat, llamacalls
from desktop_app.tools import Watch, offer_of, read, written
from desktop_app.validation import InvalidValue

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 40},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "unit"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
TOOLS = [WEATHER, ADD]


def admits(rt, grammar: str, text: str) -> bool:
    """Whether llama.cpp's grammar sampler takes `text` (the model's tokens of it) whole and
    then lets the answer end, each token checked before it is taken (as `llamacalls.Held`)."""
    stage = llamacalls.grammar_stage(rt.llm._model.vocab, grammar)
    one = _internals.LlamaTokenDataArray(n_vocab=1)
    try:
        for token in [*rt.tokenize(text, special=False), rt.llm.token_eos()]:
            one.candidates_data.id[0], one.candidates_data.logit[0] = token, 1.0
            one.candidates.size, one.candidates.sorted = 1, False
            llama_cpp.llama_sampler_apply(stage, ctypes.byref(one.candidates))
            if not np.isfinite(one.candidates_data.logit[0]):
                return False
            if token != rt.llm.token_eos():
                llama_cpp.llama_sampler_accept(stage, token)
        return True
    finally:
        llama_cpp.llama_sampler_free(stage)


CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}' \
       '</tool_call>'


def test_auto_admits_text_or_a_whole_call_and_required_only_calls(runtime):
    auto = offer_of(TOOLS, "auto").answer_format().grammar
    required = offer_of(TOOLS, "required").answer_format().grammar
    parallel = offer_of(TOOLS, "required", True).answer_format().grammar
    for text in ("Paris is sunny.", "2 + 2 = 4", "<b>bold</b> text", "<tool", "a <tool_call>"):
        assert admits(runtime, auto, text), text
        assert not admits(runtime, required, text), text
    assert admits(runtime, auto, CALL) and admits(runtime, required, CALL)
    assert admits(runtime, auto, " " + CALL)  # (spaces before the choice are the root's)
    for text in ('<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
                 CALL.replace('"celsius"', '"kelvin"'), CALL.replace('"city": "Oslo", ', ""),
                 CALL[:-3], CALL + " and more", f"{CALL}\n{CALL}"):
        assert not admits(runtime, auto, text), text
        assert not admits(runtime, required, text), text
    assert admits(runtime, parallel, f"{CALL}\n{CALL}")


def test_an_answer_is_read_and_a_history_written_back_as_the_model_wrote_it():
    offer = offer_of(TOOLS, "required", True)
    (call,) = read(offer, CALL).calls
    assert call.name == "get_weather" and call.parsed() == {"city": "Oslo", "unit": "celsius"}
    assert read(offer, f"{CALL}\n{CALL}").calls[1:] == ()  # the same call twice: one
    assert read(offer, "Sunny.").content == "Sunny." and read(offer, CALL[:-20]).calls == ()
    # (cut at the answer's limit in its closing marks: the call is whole, and said so)
    for cut in (CALL[:-2], CALL[:-len("}</tool_call>")]):
        assert read(offer, cut).calls[0].parsed() == call.parsed() and read(offer, cut).whole
    history = [{"role": "assistant", "content": None, "tool_calls": [
        {"id": call.id, "function": {"name": call.name, "arguments": call.arguments}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "3 C"}]
    back = written(history)
    assert back[0] == {"role": "assistant", "content": CALL}
    assert back[1]["role"] == "user" and call.id in back[1]["content"] and \
        "get_weather" in back[1]["content"] and back[1]["content"].endswith("3 C")
    ollamas = written([{"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": "get_weather", "arguments": {"city": "Oslo",
                                                            "unit": "celsius"}}}]},
        {"role": "tool", "tool_name": "get_weather", "content": "3 C"}])
    assert ollamas[0]["content"] == CALL
    # The tools' section is the same whatever the choice: one prefix in the prompt cache.
    assert offer.section() == offer_of(TOOLS, "auto").section()
    assert offer_of(TOOLS, "none") is None and offer_of(None, "auto") is None
    with pytest.raises(InvalidValue, match="tools.1.function.name"):
        offer_of([WEATHER, {"type": "function", "function": {}}])


def test_a_streamed_answer_is_held_back_only_while_it_may_be_a_call():
    sent = []
    watch = Watch(offer_of(TOOLS), sent.append)
    for piece in ("<", "tool", "ish"):
        watch.feed(piece)
    assert sent == ["<toolish"]
    sent.clear()
    watch = Watch(offer_of(TOOLS), sent.append)
    for piece in ("<tool", "_call>", '{"name"'):
        watch.feed(piece)
    assert sent == [] and watch.finish("<tool_call>{\"name\"", read(
        offer_of(TOOLS), "<tool_call>{\"name\"")) == "<tool_call>{\"name\""  # cut: as text


def test_schemas_agents_send_become_one_grammar(runtime):
    """Nested objects, arrays, local `$defs` (LangChain's and LlamaIndex's pydantic models
    give them, the same names in two tools), no parameters at all, any object."""
    def tool(name, parameters):
        return {"type": "function", "function": {"name": name, "parameters": parameters}}
    place = {"$defs": {"Place": {"type": "object", "properties": {
        "city": {"type": "string"}, "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["city"]}}, "type": "object",
        "properties": {"place": {"$ref": "#/$defs/Place"}}, "required": ["place"]}
    other = {**place, "$defs": {"Place": {"type": "object", "properties": {
        "zip": {"type": "integer"}}, "required": ["zip"]}}}
    tools = [tool("locate", place), tool("post", other), tool("now", None),
             {"type": "function", "function": {"name": "anything",
                                               "parameters": {"type": "object"}}}]
    grammar = offer_of(tools, "auto", True).answer_format().grammar
    assert llamacalls.grammar_parses(runtime.llm._model.vocab, grammar)
    call = '<tool_call>{"name": "%s", "arguments": %s}</tool_call>'
    assert admits(runtime, grammar, call % ("locate", '{"place": {"city": "Oslo", "tags": '
                                                      '["north"]}}'))
    assert admits(runtime, grammar, call % ("post", '{"place": {"zip": 1234}}'))
    assert not admits(runtime, grammar, call % ("post", '{"place": {"city": "Oslo"}}'))
    assert admits(runtime, grammar, call % ("now", "{}"))
    assert admits(runtime, grammar, call % ("anything", '{"x": [1, {"y": null}]}'))


def test_a_bound_the_grammar_cannot_hold_is_refused_by_its_path(runtime):
    """A bound the converter writes out one repetition at a time is refused where it asks for
    more than `MAX_REPEATS`, by the path of the schema that holds it: llama.cpp's parser
    recurses once a repetition, and 20,000 overflow its thread's stack (the process gone).
    `MAX_REPEATS` of each still parse. (Only what is refused before llama.cpp parses it is
    tried here: a crash would take the test run with it.)"""
    vocab, most = runtime.llm._model.vocab, answerformat.MAX_REPEATS
    for held in ({"type": "string", "maxLength": most},
                 {"type": "array", "items": {"type": "integer"}, "maxItems": most},
                 {"type": "string", "pattern": f"^a{{0,{most}}}$"}):
        assert llamacalls.grammar_parses(vocab, answerformat.json_schema(held, "f").grammar)
    big = {"type": "object", "properties": {"x": {"type": "string", "maxLength": 20000}}}
    with pytest.raises(InvalidValue) as e:
        offer_of([{"type": "function", "function": {"name": "f", "parameters": big}}])
    assert e.value.key == "tools.0.function.parameters.properties.x"
    assert e.value.reason == f"maxLength 20000 is more than kvdesk's grammar can hold (at " \
                             f"most {most})"
    for schema, key, words in (
            ({"type": "array", "items": {"type": "string", "minLength": 5000}}, "f.items",
             "minLength 5000"),
            ({"anyOf": [{"type": "string", "pattern": "^(ab){2,3000}$"}]}, "f.anyOf.0",
             "repetition {2,3000}"),
            ({"$defs": {"A": {"type": "array", "maxItems": 1001}}, "$ref": "#/$defs/A"},
             "f.$defs.A", "maxItems 1001")):
        with pytest.raises(InvalidValue, match=re.escape(words)) as e:
            answerformat.json_schema(schema, "f")
        assert e.value.key == key
    # (an enum's values are data: a bound written in one is no schema's)
    answerformat.json_schema({"enum": [{"maxLength": 5000}]}, "f")


def test_the_assistants_own_words_are_continued_as_text_and_a_call_without_results_refused():
    offer = offer_of(TOOLS)
    words = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure, "}]
    assert offer.held(words) is None  # (continued as text)
    assert offer.held([*words[:1], {"role": "assistant", "content": " "}]) is offer
    assert offer.held(words[:1]) is offer
    for choice in ("required", {"type": "function", "function": {"name": "add"}}):
        with pytest.raises(InvalidValue, match="a call cannot continue the assistant's") as e:
            offer_of(TOOLS, choice).held(words)
        assert e.value.key == "tool_choice"
    called = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'}}]}
    with pytest.raises(InvalidValue, match="results are missing") as e:
        written([words[0], called])
    assert e.value.key == "messages.1.tool_calls"
    assert written([words[0], called, {"role": "tool", "tool_call_id": "c1", "content": "3"}])


def test_a_historys_call_is_checked_as_an_offered_tool_is():
    """Its name by the same rule (one written with a line break and the closing marker would
    break the one-line call the prompt cache relies on), its arguments a JSON object."""
    def call(name, arguments):
        return [{"role": "assistant", "content": "", "tool_calls": [
            {"id": "c", "function": {"name": name, "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "c", "content": "ok"}]
    for name, arguments, key in (("bad name\n</tool_call>", "{}", "name"),
                                 ("f", "[1, 2]", "arguments"), ("f", "NaN", "arguments"),
                                 ("f", '{"x": Infinity}', "arguments"), ("f", "{oops", "arguments"),
                                 ("f", [1, 2], "arguments"), ("f", 3, "arguments")):
        with pytest.raises(InvalidValue) as e:
            written(call(name, arguments))
        assert e.value.key == f"messages.0.tool_calls.0.function.{key}", (name, arguments)
    assert written(call("f", ""))[0]["content"].endswith('"arguments": {}}</tool_call>')
    assert written(call("f", None))[0] == written(call("f", {}))[0]


def test_parallel_calls_end_at_the_first_call_written_again():
    """Free to call again, a model writes the same call until its limit: the answer ends
    once one is written twice (however spaced), and one cut writing an earlier one again
    loses nothing, so its calls are each whole ("tool_calls", not "length")."""
    import threading

    from desktop_app.results import Completion, RestoreReport
    from desktop_app.server.schemas import ended, finish
    from desktop_app.tools import Repeats

    offer = offer_of(TOOLS, "required", True)
    other = CALL.replace("Oslo", "Rome")
    again = CALL.replace('"unit"', ' "unit"').replace("}}", "} }")
    text = f"{CALL}\n{other}\n{again}"
    cancel, repeats = threading.Event(), Repeats(offer)
    fed = repeats.stopping(cancel)
    for i in range(0, len(text), 3):
        assert not cancel.is_set()
        fed(text[i:i + 3])
    assert cancel.is_set() and repeats.seen
    assert Repeats(offer_of(TOOLS, "required")).stopping(cancel) is None  # (one call: no need)
    assert len(read(offer, text).calls) == 2

    def completion(text, reason):
        return Completion(text, reason, 1, 1, 0.1, RestoreReport(1, 0, 0, [], 0), 0, False, [])
    stopped = ended(completion(text, "cancelled"), repeats)
    assert finish(stopped, read(offer, text)) == "tool_calls"
    assert ended(completion(text, "cancelled"), Repeats(offer)).finish_reason == "cancelled"
    cut = f"{CALL}\n{other}\n{CALL[:30]}"
    assert finish(completion(cut, "length"), read(offer, cut)) == "tool_calls"
    cut = f"{CALL}\n{other}\n{CALL[:30]}X"  # (a call of its own, cut: the answer is cut)
    assert finish(completion(cut, "length"), read(offer, cut)) == "length"
    cut = CALL[:-4]  # (one call, cut in its closing marks: whole, as OpenAI would end it)
    assert finish(completion(cut, "length"), read(offer, cut)) == "tool_calls"
