"""The registry's pages inside the operators' admin: the Engines page."""

from django.contrib import admin
from django.urls import path

from .admin_engines import engines_page

urlpatterns = [
    path("engines/", admin.site.admin_view(engines_page), name="admin-engines"),
]
