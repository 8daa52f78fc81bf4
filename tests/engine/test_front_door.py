"""The engine's front door: `from inference.engine import ...` gives the public API, loads
each name only when it is asked for, and never pulls in Django."""

import importlib

import pytest

import inference.engine
from tests.fresh_python import modules_after


@pytest.mark.parametrize("name", inference.engine.__all__)
def test_every_public_name_comes_from_the_module_that_defines_it(name):
    value = getattr(inference.engine, name)
    home = importlib.import_module(f"inference.engine.{inference.engine._HOME[name]}")
    assert value is getattr(home, name)
    assert value.__module__ == home.__name__


def test_the_public_names_are_listed_once():
    assert sorted(inference.engine.__all__) == sorted(inference.engine._HOME)


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'Adapter'"):
        inference.engine.Adapter  # noqa: B018


def test_a_request_is_built_without_torch():
    script = (
        "from inference.engine import EngineRequest, LoRARequest, SamplingParams\n"
        "EngineRequest('r', 'hi', SamplingParams(), lora_request=LoRARequest('a', 'uid'))"
    )
    assert "torch" not in modules_after(script)


def test_the_engine_imports_without_django():
    modules = modules_after("from inference.engine import AsyncLLMEngine, LLMEngine")
    assert "torch" in modules
    assert not modules & {"django", "rest_framework"}
