"""Which sampling an answer uses, and where each of its values comes from.

Every field of `options.GenerationOptions` is taken from the first of four layers that sets
it (a field left None does not):

    request         what this ask passed: a `kvdesk ask` flag, a local API request field
    settings file   the "generation" keys the user set in the settings file (or the GUI)
    model file      the model's own recommendation: GGUF `general.sampling.*` metadata
    kvdesk default  `DEFAULTS`, measured on held-out questions (benchmarks/bench_answers.py)

`resolve` applies them and says, per field, which layer won (`kvdesk info` shows it). The
seed is only ever a request's or the settings': without one, every answer draws a new seed.

A leaf on `options`: it never loads a model (the model file's metadata is handed in as a
mapping, as llama.cpp reads it) and never decides what a front end shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..options import GenerationOptions
from ..validation import InvalidValue, parse

REQUEST, SETTINGS, MODEL, KVDESK = "request", "settings file", "model file", "kvdesk default"

# Chosen on the tuning questions of benchmarks/bench_answers.py (figures in RESULTS.md): greedy
# without a penalty, 11 answers in 12 repeated a sentence. LM Studio's sampling (Ollama's and
# llama.cpp's are alike), its 1.1 repetition penalty looking at the last 256 tokens rather than
# 64: a loop of two sentences outran 64 (12.5 % of answers repeated, 6 in 24 ran to max_tokens;
# 4.2 % and none over 256). Lower temperatures looped more (0.4: 5 in 12).
DEFAULTS = GenerationOptions(max_tokens=512, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05,
                             repeat_penalty=1.1, repeat_last_n=256, presence_penalty=0.0,
                             frequency_penalty=0.0)

# The model file's keys, as llama.cpp's convert script writes them from a model's
# generation_config.json (often only some of them).
GGUF_KEYS = {
    "temperature": "general.sampling.temp",
    "top_k": "general.sampling.top_k",
    "top_p": "general.sampling.top_p",
    "min_p": "general.sampling.min_p",
    "repeat_penalty": "general.sampling.penalty_repeat",
    "repeat_last_n": "general.sampling.penalty_last_n",
}


@dataclass(frozen=True)
class Sampling:
    """The values an answer is generated with, every field set (the seed may stay None: a
    new one each time), and the layer each came from."""

    options: GenerationOptions
    sources: Mapping[str, str]

    def as_dict(self) -> dict:
        return {name: {"value": getattr(self.options, name), "from": self.sources[name]}
                for name in GenerationOptions.model_fields}


def resolve(request: GenerationOptions = GenerationOptions(), *,
            settings: GenerationOptions = GenerationOptions(),
            model: GenerationOptions = GenerationOptions()) -> Sampling:
    """Each field from the request, else the settings file, else the model file, else
    kvdesk's default."""
    layers = ((REQUEST, request), (SETTINGS, settings), (MODEL, model), (KVDESK, DEFAULTS))
    values, sources = {}, {}
    for name in GenerationOptions.model_fields:
        for source, layer in layers:
            value = getattr(layer, name)
            if value is not None:
                values[name], sources[name] = value, source
                break
        else:
            values[name], sources[name] = None, KVDESK  # the seed: a new one each time
    return Sampling(GenerationOptions(**values), sources)


def from_model(metadata: Mapping[str, str]) -> tuple[GenerationOptions, list[str]]:
    """The sampling a model file recommends (its general.sampling.* keys), and a note for
    each value that is unusable and ignored (a file is not trusted more than a user)."""
    values, notes = {}, []
    for name, key in GGUF_KEYS.items():
        raw = metadata.get(key)
        if raw is None:
            continue
        try:
            number = float(raw)
            if GenerationOptions.model_fields[name].annotation == int | None:
                if not number.is_integer():
                    raise InvalidValue(name, "not a whole number")
                number = int(number)
            values[name] = getattr(parse(GenerationOptions, {name: number}), name)
        except (ValueError, OverflowError) as e:  # InvalidValue is a ValueError
            reason = e.reason if isinstance(e, InvalidValue) else "not a number"
            notes.append(f"the model file's {key} = {raw!r} is ignored: {reason}")
    return GenerationOptions(**values), notes
