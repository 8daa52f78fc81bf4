from django.urls import path

from . import views

urlpatterns = [
    path("chat/completions", views.chat_completions, name="chat-completions"),
    path("completions", views.completions, name="completions"),
    path("models", views.models, name="models"),
    path("<str:action>", views.operator_endpoint, name="operator"),
]
