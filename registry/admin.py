"""Operators' admin for the registry. Every change goes through a service, so it is audited.

Each action names the permission it needs (`permissions=`), so a staff user who may only view
sees no actions and a forged POST of one is refused: changing state needs the model's change
permission, touching the engines `registry.operate_engines` (registry/permissions.py).
"""

from django.contrib import admin, messages
from django.contrib.auth import get_permission_codename
from django.db.models import Count
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from platform_site.admin_columns import count_column

from . import engines
from .errors import RegistryError
from .model_names import alias_name, version_name
from .models import Adapter, AdapterVersion, Alias, BaseModel, EvalSet, Evaluation
from .names import PRODUCTION
from .permissions import OPERATE_ENGINES_CODENAME, can_operate_engines
from .quality import figure, short_revision
from .selectors import quality_progress
from .services.aliases import alias_set
from .services.base_models import base_model_recheck_request
from .services.evaluations import evaluation_override, evaluations_rerun
from .services.versions import adapter_version_restage, adapter_version_revalidate

# The admin index links to the read-only engines page (registry/admin_engines.py).
admin.site.index_template = "admin/loraplex_index.html"


def admin_actor(request) -> str:
    return f"admin:{request.user.get_username()}"


def pin_on_engines(request, lora_names: list[str], *, pinned: bool) -> None:
    """Ask every engine in LORAPLEX_ENGINE_URLS to (un)pin each adapter; report per engine."""
    if not engines.engine_urls():
        messages.error(
            request,
            "No engine is configured: set LORAPLEX_ENGINE_URLS (and LORAPLEX_OPERATOR_TOKEN) "
            "to pin or unpin adapters.",
        )
        return
    verb = "Pinned" if pinned else "Unpinned"
    for name in lora_names:
        for result in engines.set_pinned(name, pinned=pinned):
            if result.ok:
                messages.success(request, f"{verb} {name} on {result.engine}.")
            else:
                messages.error(request, f"{name} on {result.engine}: {result.message}")


class ReadOnlyAdmin(admin.ModelAdmin):
    """No editing of fields here; state changes only through the actions, each a service."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_manage_permission(self, request) -> bool:
        """The model's change permission, which the actions (not the forms) exercise."""
        codename = get_permission_codename("change", self.opts)
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    def has_operate_engines_permission(self, request) -> bool:
        return can_operate_engines(request.user)


MANAGE = ("manage",)
OPERATE = (OPERATE_ENGINES_CODENAME,)


@admin.register(BaseModel)
class BaseModelAdmin(ReadOnlyAdmin):
    list_display = [
        "name",
        "short_revision",
        "scheme",
        "is_default",
        "evaluation_progress",
        "local_path",
        "updated_at",
    ]
    list_filter = ["is_default"]
    search_fields = ["name", "revision", "local_path"]
    readonly_fields = ["upgrade_progress"]
    actions = ["recheck"]

    @admin.display(description="revision")
    def short_revision(self, obj):
        return obj.revision[:12]

    @admin.display(description="quantization", ordering="quantization")
    def scheme(self, obj):
        return obj.quantization or "none"

    @admin.display(description="adapter versions on this revision")
    def evaluation_progress(self, obj):
        """Counts per quality state (ready versions): an upgrade's progress at a glance."""
        progress = quality_progress(base_model=obj, limit=0)
        parts = [f"{n} {state}" for state, n in progress.counts.items() if n]
        return f"{progress.done}/{progress.total} evaluated: " + (", ".join(parts) or "none")

    @admin.display(description="quality gate on the current revision")
    def upgrade_progress(self, obj):
        """The counts per quality state, and every degraded (or failed) version with why."""
        progress = quality_progress(base_model=obj)
        counts = format_html_join(
            "",
            '<tr><td><span class="quality-{}">{}</span></td><td>{}</td></tr>',
            ((state, state, n) for state, n in progress.counts.items()),
        )
        versions_url = reverse("admin:registry_adapterversion_changelist")
        degraded = format_html_join(
            "",
            '<li><a href="{}?q={}">{}</a> ({}): {}</li>',
            ((versions_url, v.uid, v, v.quality, v.quality_detail) for v in progress.degraded),
        )
        return format_html(
            "<p>revision <code>{}</code>: {} of {} ready versions evaluated</p>"
            "<table><tr><th>quality</th><th>versions</th></tr>{}</table>"
            "<p>Degraded or failed here (not served until an operator overrides them, or a "
            "new version passes):</p><ul>{}</ul>",
            short_revision(progress.revision),
            progress.done,
            progress.total,
            counts,
            degraded or format_html("<li>none</li>"),
        )

    @admin.action(
        description="Re-check every adapter version against the current revision",
        permissions=MANAGE,
    )
    def recheck(self, request, queryset):
        for base in queryset:
            base_model_recheck_request(base_model=base, actor=admin_actor(request))
        messages.success(
            request, f"Queued a compatibility re-check for {queryset.count()} model(s)."
        )


class AliasInline(admin.TabularInline):
    model = Alias
    extra = 0
    fields = readonly_fields = ("name", "version", "weight", "updated_by", "updated_at")

    def has_add_permission(self, request, obj=None):
        return False


@admin.register(Adapter)
class AdapterAdmin(ReadOnlyAdmin):
    list_display = [
        "name",
        "tenant",
        "base_model",
        "version_count",
        "alias_list",
        "created_by",
        "created_at",
    ]
    list_filter = ["base_model", "tenant"]
    search_fields = ["name", "tenant__slug", "description"]
    inlines = [AliasInline]
    actions = ["pin", "unpin"]

    version_count = count_column("n_versions", description="versions")

    def get_queryset(self, request):
        adapters = super().get_queryset(request).select_related("tenant", "base_model")
        adapters = adapters.prefetch_related("aliases__version")
        return adapters.annotate(n_versions=Count("versions", distinct=True))

    @admin.display(description="aliases")
    def alias_list(self, obj):
        return ", ".join(f"{a.name}→v{a.version.number}" for a in obj.aliases.all()) or "–"

    def _production_names(self, request, queryset) -> list[str]:
        names = []
        for adapter in queryset.select_related("tenant"):
            production = adapter.aliases.filter(name=PRODUCTION).select_related("adapter__tenant")
            if production:
                names.append(alias_name(production[0]))
            else:
                messages.warning(
                    request,
                    f"{adapter}: no '{PRODUCTION}' alias; pin one of its versions or aliases "
                    "instead.",
                )
        return names

    @admin.action(
        description="Pin the production alias on the engines (kept loaded)", permissions=OPERATE
    )
    def pin(self, request, queryset):
        pin_on_engines(request, self._production_names(request, queryset), pinned=True)

    @admin.action(description="Unpin the production alias on the engines", permissions=OPERATE)
    def unpin(self, request, queryset):
        pin_on_engines(request, self._production_names(request, queryset), pinned=False)


@admin.register(AdapterVersion)
class AdapterVersionAdmin(ReadOnlyAdmin):
    list_display = [
        "__str__",
        "status",
        "compatible",
        "quality_column",
        "rank",
        "size",
        "attempts",
        "created_by",
        "created_at",
    ]
    list_filter = [
        "status",
        "compatible",
        "quality",
        "infra_failure",
        "adapter__base_model",
        "adapter__tenant",
    ]
    search_fields = ["adapter__name", "adapter__tenant__slug", "weights_sha256", "uid"]
    readonly_fields = ["readable_report", "evaluations_table"]
    exclude = ["report"]
    actions = ["revalidate", "restage", "promote", "evaluate", "override_quality", "pin", "unpin"]

    @admin.display(description="quality", ordering="quality")
    def quality_column(self, obj):
        return format_html('<span title="{}">{}</span>', obj.quality_detail, obj.quality)

    @admin.display(description="evaluations")
    def evaluations_table(self, obj):
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td>"
            "<td>{}</td><td>{}</td></tr>",
            (
                (
                    e.created_at.strftime("%Y-%m-%d %H:%M:%S"),
                    e.status,
                    short_revision(e.base_revision),
                    figure(e.adapter_perplexity),
                    figure(e.base_perplexity),
                    figure(e.reference_perplexity),
                    e.reason,
                )
                for e in obj.evaluations.order_by("-pk")[:20]
            ),
        )
        return format_html(
            "<table><tr><th>when</th><th>status</th><th>revision</th><th>adapter ppl</th>"
            "<th>base ppl</th><th>reference</th><th>reason</th></tr>{}</table>",
            rows or format_html("<tr><td colspan=7>(none yet)</td></tr>"),
        )

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("adapter__tenant")

    def has_promote_permission(self, request) -> bool:
        """Promoting moves an alias: the alias's change permission."""
        return request.user.has_perm(f"registry.{get_permission_codename('change', Alias._meta)}")

    @admin.display(description="validation report")
    def readable_report(self, obj):
        if not obj.report:
            return "(no report yet)"
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    "✔" if c.get("passed") else ("⚠" if c.get("level") == "warning" else "✘"),
                    c.get("name"),
                    c.get("level"),
                    c.get("message"),
                )
                for c in obj.report
            ),
        )
        return format_html(
            "<table><tr><th></th><th>check</th><th>level</th><th>message</th></tr>{}</table>", rows
        )

    @admin.action(description="Re-validate selected versions (not ready ones)", permissions=MANAGE)
    def revalidate(self, request, queryset):
        done = 0
        for version in queryset:
            try:
                adapter_version_revalidate(version=version, actor=admin_actor(request))
                done += 1
            except RegistryError as exc:
                messages.warning(request, exc.message)
        messages.success(request, f"Queued validation of {done} version(s).")

    @admin.action(
        description="Re-stage selected ready versions into the adapter cache", permissions=MANAGE
    )
    def restage(self, request, queryset):
        actor = admin_actor(request)
        queued = [v for v in queryset if adapter_version_restage(version=v, actor=actor)]
        messages.success(request, f"Queued staging of {len(queued)} version(s).")

    @admin.action(
        description="Move the 'production' alias to the selected version", permissions=["promote"]
    )
    def promote(self, request, queryset):
        for version in queryset.select_related("adapter"):
            try:
                alias_set(
                    adapter=version.adapter,
                    name=PRODUCTION,
                    version_number=version.number,
                    actor=admin_actor(request),
                )
                messages.success(
                    request, f"{version.adapter.name}@{PRODUCTION} -> v{version.number}"
                )
            except RegistryError as exc:
                messages.error(request, f"{version}: {exc.message}")

    @admin.action(
        description="Re-run the evaluation of selected versions (quality gate)",
        permissions=MANAGE,
    )
    def evaluate(self, request, queryset):
        queued = evaluations_rerun(
            versions=queryset.select_related("adapter"), actor=admin_actor(request)
        )
        skipped = queryset.count() - len(queued)
        messages.success(request, f"Queued the evaluation of {len(queued)} version(s).")
        if skipped:
            messages.warning(
                request,
                f"{skipped} version(s) are not ready and checked compatible with their base "
                "model's current revision: nothing to evaluate.",
            )

    @admin.action(
        description="Override the quality gate: let degraded or failed versions serve",
        permissions=MANAGE,
    )
    def override_quality(self, request, queryset):
        for version in queryset.select_related("adapter__tenant"):
            try:
                evaluation_override(version=version, actor=admin_actor(request))
                messages.success(
                    request, f"{version}: overridden; it serves on this base revision."
                )
            except RegistryError as exc:
                messages.error(request, f"{version}: {exc.message}")

    @admin.action(
        description="Pin selected ready versions on the engines (kept loaded)", permissions=OPERATE
    )
    def pin(self, request, queryset):
        ready = queryset.filter(status=AdapterVersion.READY)
        for version in queryset.exclude(status=AdapterVersion.READY):
            messages.warning(request, f"{version} is {version.status}; only ready versions load.")
        pin_on_engines(request, [version_name(v) for v in ready], pinned=True)

    @admin.action(description="Unpin selected versions on the engines", permissions=OPERATE)
    def unpin(self, request, queryset):
        names = [version_name(v) for v in queryset]
        pin_on_engines(request, names, pinned=False)


@admin.register(Alias)
class AliasAdmin(ReadOnlyAdmin):
    list_display = ["adapter", "name", "version", "weight", "updated_by", "updated_at"]
    list_filter = ["name", "adapter__tenant"]
    search_fields = ["adapter__name", "name", "adapter__tenant__slug"]
    actions = ["pin", "unpin"]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("adapter__tenant", "version")

    @admin.action(
        description="Pin selected aliases on the engines (kept loaded)", permissions=OPERATE
    )
    def pin(self, request, queryset):
        pin_on_engines(request, [alias_name(a) for a in queryset], pinned=True)

    @admin.action(description="Unpin selected aliases on the engines", permissions=OPERATE)
    def unpin(self, request, queryset):
        pin_on_engines(request, [alias_name(a) for a in queryset], pinned=False)


@admin.register(EvalSet)
class EvalSetAdmin(ReadOnlyAdmin):
    """Read-only: tenants replace theirs through the API, operators the generic ones with
    `manage.py set_default_eval_set`; rows and their objects go together, never here."""

    list_display = [
        "__str__",
        "adapter",
        "base_model",
        "is_current",
        "rows",
        "size",
        "short_sha256",
        "created_by",
        "created_at",
    ]
    list_filter = ["is_current", "base_model", "adapter__tenant"]
    search_fields = ["adapter__name", "adapter__tenant__slug", "base_model__name", "sha256"]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("adapter__tenant", "base_model")

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="sha256")
    def short_sha256(self, obj):
        return obj.sha256[:12]


@admin.register(Evaluation)
class EvaluationAdmin(ReadOnlyAdmin):
    """Read-only: evaluations are made by the worker; re-run and override on the versions."""

    list_display = [
        "version",
        "status",
        "trigger",
        "revision",
        "adapter_ppl",
        "base_ppl",
        "reference_ppl",
        "duration",
        "created_at",
    ]
    list_filter = ["status", "trigger", "version__adapter__base_model", "version__adapter__tenant"]
    search_fields = [
        "version__adapter__name",
        "version__adapter__tenant__slug",
        "base_revision",
        "reason",
    ]
    exclude = ["rows"]
    readonly_fields = ["per_row"]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("version__adapter__tenant")

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="revision", ordering="base_revision")
    def revision(self, obj):
        scheme = f" ({obj.base_quantization})" if obj.base_quantization else ""
        return obj.base_revision[:12] + scheme

    @admin.display(description="adapter ppl", ordering="adapter_perplexity")
    def adapter_ppl(self, obj):
        return figure(obj.adapter_perplexity)

    @admin.display(description="base ppl", ordering="base_perplexity")
    def base_ppl(self, obj):
        return figure(obj.base_perplexity)

    @admin.display(description="reference ppl")
    def reference_ppl(self, obj):
        return figure(obj.reference_perplexity)

    @admin.display(description="seconds", ordering="duration_seconds")
    def duration(self, obj):
        return "–" if obj.duration_seconds is None else f"{obj.duration_seconds:.1f}"

    @admin.display(description="per row (summed NLL)")
    def per_row(self, obj):
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (i, row.get("tokens"), row.get("adapter_nll"), row.get("base_nll"))
                for i, row in enumerate(obj.rows or [], 1)
            ),
        )
        return format_html(
            "<table><tr><th>row</th><th>tokens</th><th>adapter</th><th>base</th></tr>{}</table>",
            rows or format_html("<tr><td colspan=4>(none)</td></tr>"),
        )
