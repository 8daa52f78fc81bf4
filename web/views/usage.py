"""Usage: tokens per day per adapter, as a server-rendered SVG chart and a table."""

from datetime import datetime, time, timedelta

from django.utils import timezone
from django.views.decorators.http import require_GET

from tenants.scopes import REGISTRY_READ
from tenants.usage import usage_totals

from ..charts import stacked_bars
from ..decorators import scope_required
from ..forms import UsagePeriodForm
from ..pages import render_page

TOTALS = ("requests", "prompt_tokens", "completion_tokens", "total_tokens")


@require_GET
@scope_required(REGISTRY_READ)
def usage(request):
    # Bound to the period shown, so the selector and the chart always say the same.
    form = UsagePeriodForm({"days": request.GET.get("days") or UsagePeriodForm.DEFAULT})
    if not form.is_valid():
        return render_page(request, "web/usage.html", {"form": form, "days": None}, status=400)
    days = form.cleaned_data["days"]
    today = timezone.now().date()
    first = today - timedelta(days=days - 1)
    start = datetime.combine(first, time.min, tzinfo=timezone.get_current_timezone())
    # Per adapter, all its versions together: one bar segment and one row per adapter a day.
    rows = usage_totals(
        tenant=request.principal.tenant,
        start=start,
        end=start + timedelta(days=days),
        by=("day", "adapter"),
    )
    dates = [first + timedelta(days=i) for i in range(days)]
    series: dict = {}
    for row in sorted(rows, key=lambda r: (r["adapter"], r["day"])):
        series.setdefault(row["adapter"], {})[row["day"]] = row["total_tokens"]
    context = {
        "form": form,
        "days": days,
        "chart": stacked_bars(dates, series),
        "rows": sorted(rows, key=lambda r: (r["day"], r["adapter"]), reverse=True),
        "totals": {key: sum(row[key] for row in rows) for key in TOTALS},
    }
    return render_page(request, "web/usage.html", context)
