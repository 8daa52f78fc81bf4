"""The /v1/ routes: OpenAI's endpoints, and the operator protocol's, one route per action
(any other path is a plain 404)."""

from django.urls import path

from platform_site import operator_protocol as protocol

from .openai import views as openai_views
from .openai.responses import views as responses_views
from .operator import views as operator_views

urlpatterns = [
    path("chat/completions", openai_views.chat_completions, name="chat-completions"),
    path("completions", openai_views.completions, name="completions"),
    path("responses", responses_views.responses, name="responses"),
    path("responses/<str:response_id>", responses_views.response, name="response"),
    path("models", openai_views.models, name="models"),
    path("models/<path:model_id>", openai_views.model, name="model"),  # a name may hold "/"
    path(protocol.LOAD, operator_views.load_lora_adapter, name="operator-load"),
    path(protocol.UNLOAD, operator_views.unload_lora_adapter, name="operator-unload"),
    path(protocol.PIN, operator_views.pin_lora_adapter, name="operator-pin"),
    path(protocol.UNPIN, operator_views.unpin_lora_adapter, name="operator-unpin"),
    path(protocol.LIST, operator_views.lora_adapters_list, name="operator-list"),
    path(protocol.SCORE, operator_views.score, name="operator-score"),  # the quality gate
]
