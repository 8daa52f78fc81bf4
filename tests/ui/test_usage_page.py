"""Usage: tokens per day per adapter as an SVG chart and a table, for the own tenant only."""

import re
from datetime import date, timedelta

import pytest
from django.utils import timezone

from tests.ui.conftest import make_version, page
from tests.usage_records import usage_record
from web.charts import nice_ceiling, stacked_bars

pytestmark = pytest.mark.django_db


def test_the_usage_page_charts_and_tabulates_tokens_per_day_and_adapter(
    signed_in, bob, adapter, good_adapter_dir, tenant_b, base_model
):
    v1 = make_version(adapter, good_adapter_dir)
    tenant = adapter.tenant
    usage_record(tenant, version=v1, model="support-bot", prompt=100, completion=20)
    usage_record(tenant, version=v1, model="support-bot@canary", prompt=1, completion=2)
    usage_record(tenant, version=v1, model="support-bot", prompt=30, completion=3, days_ago=2)
    usage_record(tenant, model="tiny-llama", prompt=7, completion=7)
    usage_record(tenant_b, model="tiny-llama", prompt=9999, completion=1)  # another tenant's
    usage_record(tenant, model="tiny-llama", prompt=5, completion=5, days_ago=45)  # outside 30 days

    html = page(signed_in(bob).get("/usage/"))

    assert '<svg class="chart" id="usage-chart"' in html
    today = timezone.now().date()
    # Aliases and versions of one adapter add up under its name.
    assert f"{today:%Y-%m-%d} support-bot: 123 tokens" in html
    assert f"{today - timedelta(days=2):%Y-%m-%d} support-bot: 33 tokens" in html
    assert f"{today:%Y-%m-%d} tiny-llama: 14 tokens" in html
    assert "10000" not in html and "9999" not in html
    totals = html[html.index("<tfoot>") :]
    assert '<th class="num">4</th>' in totals and '<th class="num">170</th>' in totals

    older = page(signed_in(bob).get("/usage/?days=90"))
    assert "tiny-llama: 10 tokens" in older


def test_the_versions_of_one_adapter_add_up_under_its_name(
    signed_in, bob, adapter, good_adapter_dir, second_adapter_dir
):
    v1, v2 = make_version(adapter, good_adapter_dir), make_version(adapter, second_adapter_dir)
    usage_record(adapter.tenant, version=v1, model="support-bot:1", prompt=10, completion=0)
    usage_record(adapter.tenant, version=v2, model="support-bot@production", prompt=5, completion=0)

    html = page(signed_in(bob).get("/usage/"))

    assert f"{timezone.now().date():%Y-%m-%d} support-bot: 15 tokens" in html
    assert "support-bot:1" not in html and "support-bot@production" not in html


def test_without_requests_the_page_says_so(signed_in, alice, tenant_a):
    html = page(signed_in(alice).get("/usage/"))
    assert "No requests in this period." in html and "<svg" not in html


def test_bars_stack_per_day_and_scale_to_a_round_maximum():
    days = [date(2026, 1, 1), date(2026, 1, 2)]
    chart = stacked_bars(days, {"a": {days[0]: 300}, "b": {days[0]: 100, days[1]: 50}})
    plot = chart.plot_bottom - chart.plot_top
    assert [t.label for t in chart.y_ticks] == ["0", "125", "250", "375", "500"]
    first_a, first_b, second_b = chart.bars
    assert first_a.height == pytest.approx(plot * 300 / 500, abs=0.01)
    assert first_b.y + first_b.height == pytest.approx(first_a.y, abs=0.01)  # stacked on top
    assert second_b.height == pytest.approx(plot * 50 / 500, abs=0.01)
    assert first_a.color != first_b.color == second_b.color


@pytest.mark.parametrize(
    "value, ceiling", [(0, 1), (1, 1), (3, 5), (7, 10), (11, 20), (120, 200), (2_000_001, 5e6)]
)
def test_axis_maxima_are_one_two_or_five_times_a_power_of_ten(value, ceiling):
    assert nice_ceiling(value) == ceiling


@pytest.mark.parametrize("query, days", [("", 30), ("?days=7", 7), ("?days=90", 90)])
def test_the_period_selector_shows_the_period_the_chart_shows(
    signed_in, alice, tenant_a, query, days
):
    html = page(signed_in(alice).get(f"/usage/{query}"))
    assert re.findall(r'<option value="(\d+)" selected>', html) == [str(days)]
    assert f"Tokens per day (last {days} days, UTC)" in html


def test_a_period_that_is_not_offered_is_a_400_naming_it(signed_in, alice, tenant_a):
    response = signed_in(alice).get("/usage/?days=5")
    assert response.status_code == 400
    assert "Period: Select a valid choice. 5 is not one of the available choices." in page(response)
    assert "<svg" not in page(response)
