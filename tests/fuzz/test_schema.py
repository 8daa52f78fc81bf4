"""/api/schema/ describes every API a caller has: the REST API and the /v1 endpoints too."""

import pytest

from tests.fuzz.conftest import SCHEMA


def test_the_schema_lists_the_openai_compatible_and_operator_endpoints():
    paths = SCHEMA.raw_schema["paths"]
    for path, method in [
        ("/v1/chat/completions", "post"),
        ("/v1/completions", "post"),
        ("/v1/models", "get"),
        ("/v1/models/{model}", "get"),
        ("/v1/load_lora_adapter", "post"),
        ("/v1/unload_lora_adapter", "post"),
        ("/v1/pin_lora_adapter", "post"),
        ("/v1/unpin_lora_adapter", "post"),
        ("/v1/lora_adapters", "get"),
        ("/tokenize", "post"),  # vLLM's, at the root
        ("/detokenize", "post"),
    ]:
        assert method in paths[path], path
    assert {"OperatorToken": []} in paths["/v1/pin_lora_adapter"]["post"]["security"]
    assert {"ApiKey": []} in paths["/v1/models"]["get"]["security"]


def test_the_schema_describes_structured_outputs_tools_and_vllm_load_bodies():
    schemas = SCHEMA.raw_schema["components"]["schemas"]
    chat = schemas["ChatCompletionRequest"]["properties"]
    assert {"tools", "tool_choice", "parallel_tool_calls", "response_format"} <= set(chat)
    assert "response_format" in schemas["CompletionRequest"]["properties"]
    assert "tool" in schemas["ChatMessage"]["properties"]["role"]["enum"]
    assert set(schemas["LoadLora"]["properties"]) == {"lora_name", "lora_path", "load_inplace"}


@pytest.mark.django_db
def test_the_schema_page_serves_the_same_description(client):
    served = client.get("/api/schema/", headers={"Accept": "application/json"})
    assert served.status_code == 200
    assert "/v1/chat/completions" in served.content.decode()
