"""Admin list columns shared by the apps' ModelAdmins."""

from django.contrib import admin


def count_column(annotation: str, *, description: str):
    """A sortable column showing a count that the ModelAdmin's `get_queryset` annotates.

    Counting in the list's one query (not a query per row) is the point: annotate
    `annotation` there, and name this column in `list_display`.
    """

    @admin.display(description=description, ordering=annotation)
    def column(model_admin, obj):
        return getattr(obj, annotation)

    return column
