"""LORAPLEX_LORA_MODULES, in process: a malformed entry stops the start naming it; an entry
whose files cannot be registered is logged and skipped. (A live `serve` started with it
registers, loads and pins: tests/inference/operator/test_operator_load.py.)"""

import logging

import pytest

from inference.errors import EngineUnavailable
from inference.host.engine_host import HOST
from inference.host.lora_loading import OperatorCall
from inference.host.startup_adapters import configured_modules, load_lora_modules

pytestmark = pytest.mark.django_db


def test_entries_are_in_place_loads_of_name_and_path(settings):
    settings.LORA_MODULES = ["acme/bot=/models/bot", "acme/helper=s3://training/run-7/"]
    assert configured_modules() == [
        OperatorCall("acme/bot", "/models/bot", load_inplace=True),
        OperatorCall("acme/helper", "s3://training/run-7/", load_inplace=True),
    ]


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("acme/bot", "is not <tenant>/<adapter>=<folder or s3://bucket/prefix/>"),
        ("acme/bot=", "is not <tenant>/<adapter>="),
        ("bot=/models/bot", "'<tenant>/<adapter>'"),
        ("acme/bot@production=/models/bot", "'<tenant>/<adapter>'"),
        ("acme/bot:2=/models/bot", "'<tenant>/<adapter>'"),
    ],
)
def test_a_malformed_entry_stops_the_start_naming_it(settings, entry, words):
    settings.LORA_MODULES = ["acme/good=/models/good", entry]
    with pytest.raises(EngineUnavailable) as refused:
        configured_modules()
    assert f"LORAPLEX_LORA_MODULES entry {entry!r}" in refused.value.message
    assert words in refused.value.message


def test_files_that_cannot_be_registered_are_logged_and_skipped(settings, tmp_path, caplog):
    settings.LORA_MODULES = [f"nobody/bot={tmp_path}", "acme/bot=relative/run"]
    with caplog.at_level(logging.ERROR, logger="inference.host.startup_adapters"):
        assert load_lora_modules(HOST) == []  # neither reaches the engine
    logged = caplog.text
    assert "nobody/bot not loaded" in logged and "does not exist" in logged
    assert "acme/bot not loaded" in logged and "absolute" in logged
