"""The OpenAPI description and the parsers name the same fields: one source each way, so a
field added to a parser and not described (or described and refused) fails here."""

import pytest

from inference.openai import openapi, protocol
from inference.operator import openapi as operator_openapi
from inference.operator import scoring
from platform_site import operator_protocol


@pytest.mark.parametrize(
    ("schema", "fields"),
    [
        ("ChatCompletionRequest", protocol.CHAT_FIELDS),
        ("CompletionRequest", protocol.COMPLETION_FIELDS),
    ],
)
def test_a_generation_request_describes_exactly_the_fields_its_parser_takes(schema, fields):
    described = set(openapi.SCHEMAS[schema]["properties"])
    assert fields <= described, f"parsed but not described: {sorted(fields - described)}"
    extra = described - fields
    assert extra <= protocol.IGNORED_FIELDS, f"described but refused: {sorted(extra)}"


@pytest.mark.parametrize(
    ("schema", "fields"),
    [
        ("LoraName", operator_protocol.NAME_FIELDS),
        ("LoadLora", operator_protocol.LOAD_FIELDS),
        ("ScoreRequest", scoring.BODY_FIELDS),
    ],
)
def test_an_operator_body_describes_exactly_the_fields_its_parser_takes(schema, fields):
    described = operator_openapi.SCHEMAS[schema]
    assert set(described["properties"]) == set(fields)
    assert described["additionalProperties"] is False  # the parsers refuse any other


def test_a_score_row_describes_exactly_the_fields_a_row_holds():
    row = operator_openapi.SCHEMAS["ScoreRequest"]["properties"][operator_protocol.ROWS]["items"]
    assert set(row["properties"]) == scoring.ROW_FIELDS


def test_the_bounds_described_are_the_parsers():
    props = openapi.SCHEMAS["ChatCompletionRequest"]["properties"]
    assert props["n"]["maximum"] == protocol.MAX_CHOICES
    assert props["seed"]["maximum"] == protocol.MAX_SEED
    assert props["stop"]["oneOf"][1]["maxItems"] == protocol.MAX_STOP_SEQUENCES
    assert props["top_logprobs"]["maximum"] == protocol.MAX_TOP_LOGPROBS


def test_a_responses_request_describes_exactly_the_fields_its_parser_takes():
    from inference.openai.responses import openapi as responses_openapi
    from inference.openai.responses import protocol as responses_protocol

    described = set(responses_openapi.SCHEMAS["ResponseRequest"]["properties"])
    fields = responses_protocol.FIELDS
    assert fields <= described, f"parsed but not described: {sorted(fields - described)}"
    extra = described - fields
    assert extra <= responses_protocol.IGNORED_FIELDS, f"described but refused: {sorted(extra)}"
    neutral = set(responses_protocol.NEUTRAL)
    assert not neutral & described  # accepted only at their neutral value: not offered
