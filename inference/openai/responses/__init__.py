"""POST /v1/responses (OpenAI's Responses API), and GET and DELETE of a stored response.

A response is a chat underneath: its `input` items (with `instructions`, and the stored
conversation a `previous_response_id` continues) become chat messages for the model's
template, its function tools and `text.format` the chat machinery's tool use and JSON
constraint, and the shared generation flow (generation.py) runs it. What differs is the
answer: output items, OpenAI's typed stream events, and the conversation kept per tenant.
"""
