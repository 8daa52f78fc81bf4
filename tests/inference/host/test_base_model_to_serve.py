"""Which base model a `serve` replica runs: LORAPLEX_BASE_MODEL's, else the default one; a
name that is not imported stops the start with the names that are."""

import pytest

from inference.errors import EngineUnavailable
from inference.host.engine_host import _base_model_to_serve
from registry.models import BaseModel

pytestmark = pytest.mark.django_db


def base(name: str, *, default: bool = False) -> BaseModel:
    return BaseModel.objects.create(
        name=name, revision="0" * 64, fingerprint={}, local_path="/nowhere", is_default=default
    )


def test_without_a_name_the_default_base_model_is_served(settings):
    settings.BASE_MODEL_NAME = ""
    base("first", default=True)
    base("second")
    assert _base_model_to_serve().name == "first"


def test_the_named_base_model_is_served_beside_the_default(settings):
    base("first", default=True)
    base("second")
    settings.BASE_MODEL_NAME = "second"
    assert _base_model_to_serve().name == "second"


def test_an_unknown_name_stops_the_start_naming_the_known_ones(settings):
    base("first", default=True)
    base("second")
    settings.BASE_MODEL_NAME = "third"
    with pytest.raises(EngineUnavailable, match=r"'third'.*known: first, second"):
        _base_model_to_serve()


def test_nothing_imported_says_how_to_import_one(settings):
    settings.BASE_MODEL_NAME = ""
    with pytest.raises(EngineUnavailable, match="import_base_model --preset"):
        _base_model_to_serve()
