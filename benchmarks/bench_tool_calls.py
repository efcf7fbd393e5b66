"""What holding an answer to a tool call costs, and how often the model chooses one itself.

    .venv/bin/python -m benchmarks.bench_tool_calls [--runs 5] [--tokens 48] [--model NAME]

The engine as `kvdesk serve` runs it (default settings, the default model), in-process, on a
fresh data directory, with two tools (`get_weather`, `add`) described in the system prompt as
the local API describes them (`desktop_app.tools`). For each of `--runs` questions, each
request after another question (so that each computes its own turn after the system prompt
the model holds): a plain answer (the same prompt, no grammar), a call held to the grammar
(`tool_choice` "required") and "auto" (a call or text), greedy, at most `--tokens` tokens.
Time to first token is the engine's (`Completion.ttft_s`); tokens/s counts the answer's
tokens after the first over the time after it. Then "auto" on questions that need a tool and
questions that need none: which it answered with a call; and after a call ("required") and
its result sent back as a `tool` message: whether "auto" answers in text or calls again.
Prints one JSON document with the load average and the CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius",
                                                                          "fahrenheit"]}},
        "required": ["city", "unit"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "Add two integers",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                        "b": {"type": "integer"}},
                       "required": ["a", "b"]}}}]
CALLING = ["What is the weather in Paris?", "Is it raining in London right now?",
           "How cold is it in Oslo today, in celsius?", "What is 1234 plus 4321?",
           "Add 17 and 25.", "Tell me the weather in Tokyo.",
           "Use the add tool on 3 and 4.", "Call get_weather for Berlin."]
RESULTS = {"get_weather": '{"temperature": 18, "sky": "cloudy"}', "add": '{"sum": 5555}'}
PLAIN = ["Hi! How are you?", "Write a haiku about the sea.", "What is the capital of France?",
         "Tell me a joke.", "Who wrote Hamlet?", "Translate 'good morning' into French."]


def cpu() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            name = next(line.split(":", 1)[1].strip() for line in f
                        if line.startswith("model name"))
    except (OSError, StopIteration):
        name = platform.processor()
    return f"{name}, {os.cpu_count()} cores"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=5, choices=range(1, len(CALLING) + 1))
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--model", help="a model `kvdesk models` lists (default: the settings')")
    args = p.parse_args()
    if args.model:
        os.environ["KVDESK_MODEL"] = args.model
    os.environ["KVDESK_DATA_DIR"] = tempfile.mkdtemp(prefix="kvdesk-tools-")
    os.environ["KVDESK_CONFIG_DIR"] = tempfile.mkdtemp(prefix="kvdesk-tools-cfg-")
    from desktop_app.app import App
    from desktop_app.options import GenerationOptions
    from desktop_app.settings import load
    from desktop_app.tools import offer_of, read, written

    before = os.getloadavg()
    app = App(load(), background=False)
    eng = app.engine
    eng.warm_up()
    generation = GenerationOptions(max_tokens=args.tokens, temperature=0)
    modes = {"plain": None, "required": offer_of(TOOLS, "required").answer_format(),
             "auto": offer_of(TOOLS, "auto").answer_format()}
    offer = offer_of(TOOLS)

    def asked(question: str, answer_format):
        messages = offer.messages([{"role": "user", "content": question}])
        t0 = time.perf_counter()
        done = eng.complete(messages, generation=generation, answer_format=answer_format)
        total = time.perf_counter() - t0
        rate = (done.completion_tokens - 1) / max(total - done.ttft_s, 1e-9)
        return done, {"ttft_s": done.ttft_s, "tokens": done.completion_tokens,
                      "tok_s": round(rate, 1), "total_s": round(total, 3)}

    filler = GenerationOptions(max_tokens=1, temperature=0)
    runs = {mode: [] for mode in modes}
    for question in CALLING[:args.runs]:
        for mode, answer_format in modes.items():
            # (another question first: each measured request computes its own turn after the
            # system prompt the model holds, none finding the one before it held)
            eng.complete(offer.messages([{"role": "user", "content": f"{mode}?"}]),
                         generation=filler)
            runs[mode].append(asked(question, answer_format)[1])
    summary = {mode: {"ttft_s_median": statistics.median(r["ttft_s"] for r in rows),
                      "tok_s_median": statistics.median(r["tok_s"] for r in rows),
                      "tokens_median": statistics.median(r["tokens"] for r in rows)}
               for mode, rows in runs.items()}
    chosen = {}
    for group, questions in (("needs_a_tool", CALLING), ("needs_none", PLAIN)):
        answers = []
        for question in questions:
            done, _ = asked(question, modes["auto"])
            said = read(offer, done.text)
            answers.append({"question": question, "call": [
                f"{c.name}({c.arguments})" for c in said.calls] or None,
                "text": None if said.calls else done.text[:60]})
        chosen[group] = {"calls": sum(bool(a["call"]) for a in answers), "of": len(answers),
                         "answers": answers}
    after = []
    required = offer_of(TOOLS, "required")
    for question in CALLING:
        user = [{"role": "user", "content": question}]
        done = eng.complete(required.messages(user), generation=generation,
                            answer_format=modes["required"])
        call = read(required, done.text).calls[0]
        history = [*user, {"role": "assistant", "content": None, "tool_calls": [
            {"id": call.id, "function": {"name": call.name, "arguments": call.arguments}}]},
            {"role": "tool", "tool_call_id": call.id, "content": RESULTS[call.name]}]
        done = eng.complete(offer.messages(written(history)), generation=generation,
                            answer_format=modes["auto"])
        said = read(offer, done.text)
        after.append({"question": question, "called": f"{call.name}({call.arguments})",
                      "then": [f"{c.name}({c.arguments})" for c in said.calls]
                      or done.text[:60]})
    eng.close()
    print(json.dumps({"model": str(app.model_path.name), "cpu": cpu(),
                      "tokens": args.tokens, "summary": summary, "runs": runs,
                      "auto_chooses": chosen, "after_a_result": {
                          "text": sum(isinstance(a["then"], str) for a in after),
                          "of": len(after), "answers": after},
                      "load_average": {"before": before, "after": os.getloadavg()}}, indent=2))


if __name__ == "__main__":
    main()
