"""The quality gate on the tenant's pages: each version's verdict, its perplexity next to the base
model's as a small SVG chart, and promotions the gate refuses, with the figure that failed."""

import io
import re

import pytest
from django.test import Client

from registry.models import Alias
from registry.services import evaluations
from registry.services.base_models import base_model_import, base_model_recheck
from registry.services.eval_sets import eval_set_attach
from tests.registry.conftest import BASE_NAME, FakeScorer, run_evaluations
from tests.tiny_llama import make_tiny_llama
from tests.ui.conftest import ALICE_ACTOR, make_version, page
from tests.ui.forms import button, force_submit, press

pytestmark = pytest.mark.django_db
EVAL_SET = b'{"prompt": "2 + 2 =", "completion": " 4"}\n{"prompt": "Hi", "completion": " there"}\n'


@pytest.fixture
def scorer(monkeypatch):
    fake = FakeScorer(default_ppl=9.1, base_ppl=31.5)
    monkeypatch.setattr(evaluations, "score_on_engine", fake)
    return fake


@pytest.fixture
def evaluated(adapter, good_adapter_dir, scorer):
    eval_set_attach(adapter=adapter, file=io.BytesIO(EVAL_SET), actor=ALICE_ACTOR)
    version = make_version(adapter, good_adapter_dir)
    return version


def browser(user):
    client = Client(enforce_csrf_checks=True)  # as a browser: the page's token or nothing
    client.force_login(user)
    return client


def test_a_pending_version_says_it_is_being_evaluated(alice, evaluated):
    html = page(browser(alice).get("/adapters/support-bot/"))
    assert 'data-quality="pending"' in html and ">evaluating</span>" in html
    assert "evaluation pending on revision" in html
    assert "<svg" not in html.split('id="evaluation-v1"')[1].split("</div>")[0]


def test_a_passed_version_shows_adapter_against_base_perplexity(alice, evaluated):
    run_evaluations()
    html = page(browser(alice).get("/adapters/support-bot/"))
    block = html.split('id="evaluation-v1"')[1].split("</div>")[0]
    assert 'data-quality="passed"' in block
    bars = dict(re.findall(r'<rect [^>]*width="([\d.]+)"[^>]*data-series="(\w+)"', block))
    assert set(bars.values()) == {"adapter", "base"}
    widths = {series: float(width) for width, series in bars.items()}
    assert 0 < widths["adapter"] < widths["base"]  # 9.1 against 31.5, on one scale
    assert ">9.1<" in block and ">31.5<" in block
    assert "first evaluation: 9.1" in block  # the reference mark
    assert "gate limit: 10.01 (x1.1)" in block
    assert "2 rows of its own eval set" in block


def test_promoting_a_degraded_version_is_refused_on_the_page_with_the_figure(
    alice, adapter, evaluated, scorer, tmp_path
):
    run_evaluations()
    base, _ = base_model_import(name=BASE_NAME, path=make_tiny_llama(tmp_path / "new", seed=1))
    base_model_recheck(base_model_id=base.pk)
    scorer.default_ppl = 14.2
    run_evaluations()
    client = browser(alice)
    html = page(client.get("/adapters/support-bot/"))
    assert 'data-quality="degraded"' in html
    reason = (
        f"degraded on revision {base.revision[:12]}…: perplexity 14.2 vs 9.1 at its first "
        "evaluation (x1.56 &gt; x1.10)"
    )
    assert reason in html
    assert "evaluation.degraded" in html  # the audit trail

    promote = button(html, "data-promote", "1")
    assert "disabled" in promote and "v1 has not passed its evaluation" in promote["title"]
    response = force_submit(client, html, "data-promote", "1")  # the server refuses it too
    assert response.status_code == 200
    assert "Could not move support-bot@production: v1 has not passed its evaluation" in page(
        response
    )
    assert reason in page(response)
    assert not Alias.objects.exists()


def test_promote_and_canary_are_disabled_while_a_version_is_evaluated(alice, evaluated):
    client = browser(alice)
    html = page(client.get("/adapters/support-bot/"))
    for action in ("data-promote", "data-canary"):
        pressed = button(html, action, "1")
        assert "disabled" in pressed, action
        assert pressed["title"].startswith("v1 has not passed its evaluation: evaluation pending")
    assert 'data-refusal="1"' in html

    response = force_submit(client, html, "data-promote", "1")
    assert "Could not move support-bot@production: v1 has not passed its evaluation" in page(
        response
    )
    assert not Alias.objects.exists()

    run_evaluations()  # passed: the same buttons work
    press(client, page(client.get("/adapters/support-bot/")), "data-promote", "1")
    assert Alias.objects.get(name="production").version.number == 1
