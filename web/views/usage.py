"""Usage: tokens per day per adapter, as a server-rendered SVG chart and a table."""

from datetime import datetime, time, timedelta

from django.utils import timezone
from django.views.decorators.http import require_GET

from tenants.scopes import REGISTRY_READ

from ..charts import stacked_bars
from ..decorators import scope_required
from ..forms import UsagePeriodForm
from ..pages import render_page
from ..selectors import usage_by_day_and_adapter


@require_GET
@scope_required(REGISTRY_READ)
def usage(request):
    form = UsagePeriodForm(request.GET)
    days = form.cleaned_data["days"] if form.is_valid() else 30
    today = timezone.now().date()
    first = today - timedelta(days=days - 1)
    start = datetime.combine(first, time.min, tzinfo=timezone.get_current_timezone())
    rows = usage_by_day_and_adapter(
        tenant=request.principal.tenant, start=start, end=start + timedelta(days=days)
    )
    dates = [first + timedelta(days=i) for i in range(days)]
    series: dict = {}
    for row in sorted(rows, key=lambda r: (r.adapter, r.day)):
        series.setdefault(row.adapter, {})[row.day] = row.total_tokens
    context = {
        "form": form,
        "days": days,
        "chart": stacked_bars(dates, series),
        "rows": sorted(rows, key=lambda r: (r.day, r.adapter), reverse=True),
        "totals": {
            "requests": sum(r.requests for r in rows),
            "prompt_tokens": sum(r.prompt_tokens for r in rows),
            "completion_tokens": sum(r.completion_tokens for r in rows),
            "total_tokens": sum(r.total_tokens for r in rows),
        },
    }
    return render_page(request, "web/usage.html", context)
