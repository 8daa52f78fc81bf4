"""The OpenAI-compatible API, grouped as vLLM's `entrypoints/openai/`: the request parser
(protocol.py; tools.py, response_format.py, constraints.py for what it holds), one module per
endpoint's serving flow (serving_chat.py, serving_completion.py over generation.py;
serving_models.py), the answers (completion_builder.py, choices.py, tool_calls/), the HTTP
views (views.py) and the OpenAPI description (openapi.py)."""
