from django.urls import path

from . import operator_protocol as protocol
from . import scoring_api, views

urlpatterns = [
    path("chat/completions", views.chat_completions, name="chat-completions"),
    path("completions", views.completions, name="completions"),
    path("models", views.models, name="models"),
    path("models/<path:model_id>", views.model, name="model"),  # a base model's name may hold "/"
    # The operator protocol, one route per action: any other path is a plain 404.
    path(protocol.LOAD, views.load_lora_adapter, name="operator-load"),
    path(protocol.UNLOAD, views.unload_lora_adapter, name="operator-unload"),
    path(protocol.PIN, views.pin_lora_adapter, name="operator-pin"),
    path(protocol.UNPIN, views.unpin_lora_adapter, name="operator-unpin"),
    path(protocol.LIST, views.lora_adapters, name="operator-list"),
    path(protocol.SCORE, scoring_api.score, name="operator-score"),  # the quality gate
]
