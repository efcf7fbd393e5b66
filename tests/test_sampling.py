"""Which sampling an answer uses: the layers (request, settings file, model file, kvdesk's
defaults), the model file's general.sampling.* keys, and the one validation of every value."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pydantic
import pytest

from desktop_app import settings
from desktop_app.model.sampling import (
    DEFAULTS,
    KVDESK,
    MODEL,
    REQUEST,
    SETTINGS,
    from_model,
    resolve,
)
from desktop_app.options import GenerationOptions
from desktop_app.validation import InvalidValue, parse


def test_each_field_comes_from_the_highest_layer_that_sets_it():
    s = resolve(GenerationOptions(temperature=0.2),
                settings=GenerationOptions(temperature=0.5, top_k=12),
                model=GenerationOptions(temperature=1.0, top_k=64, top_p=0.95))
    assert (s.options.temperature, s.sources["temperature"]) == (0.2, REQUEST)
    assert (s.options.top_k, s.sources["top_k"]) == (12, SETTINGS)
    assert (s.options.top_p, s.sources["top_p"]) == (0.95, MODEL)
    assert (s.options.min_p, s.sources["min_p"]) == (DEFAULTS.min_p, KVDESK)
    assert (s.options.repeat_penalty, s.sources["repeat_penalty"]) == (
        DEFAULTS.repeat_penalty, KVDESK)
    assert s.options.seed is None  # sampled, a new seed each time
    assert s.as_dict()["top_k"] == {"value": 12, "from": SETTINGS}


def test_an_explicit_zero_is_a_choice_not_an_absence():
    s = resolve(GenerationOptions(temperature=0, min_p=0.0),
                model=GenerationOptions(temperature=1.0, min_p=0.1))
    assert s.options.temperature == 0 and s.options.min_p == 0.0
    assert s.sources["temperature"] == s.sources["min_p"] == REQUEST
    assert s.options.seed is None  # greedy: deterministic without one; penalties kept
    assert s.options.repeat_penalty == DEFAULTS.repeat_penalty


def test_kvdesk_defaults_set_every_field_but_the_seed_and_penalize_repetition():
    assert all(getattr(DEFAULTS, f) is not None for f in GenerationOptions.model_fields
               if f != "seed")
    assert DEFAULTS.repeat_penalty > 1 and DEFAULTS.repeat_last_n > 0
    assert resolve().options == DEFAULTS


def test_the_model_files_recommendation_is_read_from_its_metadata():
    # As llama.cpp hands GGUF metadata over: every value a string.
    options, notes = from_model({
        "general.architecture": "gemma3", "general.sampling.temp": "1.000000",
        "general.sampling.top_k": "64", "general.sampling.top_p": "0.950000",
        "general.sampling.min_p": "0.000000", "general.sampling.penalty_last_n": "-1",
        "general.sampling.penalty_repeat": "1.050000"})
    assert options == GenerationOptions(temperature=1.0, top_k=64, top_p=0.95, min_p=0.0,
                                        repeat_last_n=-1, repeat_penalty=1.05)
    assert notes == []
    assert from_model({"general.name": "SmolLM2"}) == (GenerationOptions(), [])


def test_unusable_model_values_are_ignored_with_a_note():
    options, notes = from_model({"general.sampling.temp": "-3", "general.sampling.top_k": "2.5",
                                 "general.sampling.top_p": "nan", "general.sampling.min_p": "x",
                                 "general.sampling.penalty_repeat": "1.1"})
    assert options == GenerationOptions(repeat_penalty=1.1)
    assert len(notes) == 4
    assert any("general.sampling.temp = '-3'" in n and "greater than or equal to 0" in n
               for n in notes)
    assert any("top_k = '2.5'" in n and "whole number" in n for n in notes)
    assert any("min_p = 'x'" in n and "not a number" in n for n in notes)


@pytest.mark.parametrize("field,value,rule", [
    ("temperature", -0.1, "greater than or equal to 0"), ("top_p", 0, "greater than 0"),
    ("top_p", 1.5, "less than or equal to 1"), ("min_p", -1, "greater than or equal to 0"),
    ("repeat_penalty", 0, "greater than 0"), ("repeat_last_n", -2, "greater than or equal to -1"),
    ("top_k", 1.5, "should be a whole number"), ("max_tokens", 0, "greater than or equal to 1"),
    ("seed", -1, "greater than or equal to 0"), ("presence_penalty", 3, "less than or equal")])
def test_one_rule_per_value_wherever_it_comes_from(field, value, rule):
    with pytest.raises(InvalidValue, match=rule) as direct:
        parse(GenerationOptions, {field: value})
    assert direct.value.key == field
    with pytest.raises(InvalidValue, match=rule) as nested:
        parse(settings.Settings, {"generation": {field: value}})
    assert nested.value.key == f"generation.{field}"


def test_the_settings_file_keeps_only_what_the_user_set(tmp_path):
    s = settings.load()
    assert s.generation == GenerationOptions()  # nothing set: nothing pinned
    s.with_values(generation={"top_k": 20, "repeat_penalty": 1.2}).save()
    saved = json.loads((settings.config_dir() / "settings.json").read_text())["generation"]
    assert saved == {"top_k": 20, "repeat_penalty": 1.2}  # (not every default, null or not)
    loaded = settings.load().generation
    assert loaded == GenerationOptions(top_k=20, repeat_penalty=1.2)
    (settings.config_dir() / "settings.json").write_text(
        json.dumps({"version": 1, "generation": {"temperature": -1}}))
    with pytest.raises(settings.SettingsError, match=r"generation\.temperature: .*0"):
        settings.load()


def kvdesk(*args):
    return subprocess.run([sys.executable, "-m", "desktop_app", *args], capture_output=True,
                          text=True, timeout=120)


def test_a_bad_flag_is_named_as_typed():
    proc = kvdesk("ask", "1", "hello", "--top-p", "0")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == "Error: --top-p: should be greater than 0 (got 0.0)"


@pytest.mark.model
def test_info_says_which_sampling_is_in_effect_and_where_it_comes_from(model_path):
    settings.load().with_values(generation={"top_k": 12}).save()
    info = json.loads(kvdesk("info", "--json").stdout)
    assert info["sampling"]["top_k"] == {"value": 12, "from": SETTINGS}
    assert info["sampling"]["temperature"] == {"value": DEFAULTS.temperature, "from": KVDESK}
    assert info["sampling_notes"] == []  # the default model recommends nothing
    text = kvdesk("info").stdout
    assert "  top_k: 12 (settings file)" in text


@pytest.mark.parametrize("value,key,says", [
    (5, "input", "should be one of: string, array of strings, array of integers, "
                 "array of arrays of integers (got 5)"),
    ([["a"]], "input.0.0", "should be an integer"),  # past its member's shape: that member's error
    (["a", 2], "input", "should be one of: string, array of strings")])  # a mixed list
def test_a_union_is_told_as_the_json_types_it_takes(value, key, says):
    """pydantic's names for a union's members ('list[int]') are no key the user wrote."""
    class Request(pydantic.BaseModel):
        input: str | list[str] | list[int] | list[list[int]]
    with pytest.raises(InvalidValue, match=re.escape(says)) as e:
        parse(Request, {"input": value})
    assert e.value.key == key
