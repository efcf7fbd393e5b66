"""The real engine and the GUI tests' fake both implement `EngineAPI`, signature for signature,
so the fake cannot drift from the engine the GUI really drives."""

from __future__ import annotations

import inspect

import pytest

from desktop_app.engine import Engine
from desktop_app.protocol import EngineAPI
from ui.testing import FakeEngine

MEMBERS = sorted(name for name, value in vars(EngineAPI).items()
                 if not name.startswith("_") and (callable(value) or isinstance(value, property)))


def test_the_protocol_declares_the_whole_api():
    assert {"ask", "attach", "prepare", "reopen", "regenerate", "estimate", "documents",
            "chats", "messages", "levels"} <= set(MEMBERS)


@pytest.mark.parametrize("impl", [Engine, FakeEngine], ids=["Engine", "FakeEngine"])
@pytest.mark.parametrize("name", MEMBERS)
def test_each_member_has_the_protocols_signature(impl, name):
    declared = inspect.getattr_static(EngineAPI, name)
    actual = inspect.getattr_static(impl, name, None)
    assert actual is not None, f"{impl.__name__} lacks {name}"
    if isinstance(declared, property):
        assert isinstance(actual, property) or not callable(actual), \
            f"{impl.__name__}.{name} must be an attribute or a property"
        return
    assert inspect.signature(actual) == inspect.signature(declared), (
        f"{impl.__name__}.{name}{inspect.signature(actual)} differs from "
        f"EngineAPI.{name}{inspect.signature(declared)}")


@pytest.mark.parametrize("impl", [Engine, FakeEngine], ids=["Engine", "FakeEngine"])
@pytest.mark.parametrize("name", sorted(EngineAPI.__annotations__))
def test_each_declared_attribute_exists(impl, name):
    assert inspect.getattr_static(impl, name, None) is not None, f"{impl.__name__} lacks {name}"


def test_a_drifted_fake_would_be_caught():
    """The check above can fail: a signature with one keyword renamed differs."""

    def ask(self, question, *, chat_id=None, doc_id=None):  # the engine's old, narrower ask
        ...

    assert inspect.signature(ask) != inspect.signature(EngineAPI.ask)
