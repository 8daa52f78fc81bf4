"""The playground page offers the tenant's servable adapters, their aliases and the base model."""

import pytest

from registry.services.aliases import alias_set
from tests.ui.conftest import ALICE_ACTOR, make_version, page

pytestmark = pytest.mark.django_db


def test_the_playground_offers_ready_adapters_their_aliases_and_the_base(
    signed_in, bob, adapter, good_adapter_dir, tenant_b
):
    make_version(adapter, good_adapter_dir)
    alias_set(adapter=adapter, name="production", version_number=1, actor=ALICE_ACTOR)
    html = page(signed_in(bob).get("/playground/?model=support-bot@production"))

    assert '<option value="support-bot" >' in html
    assert '<option value="support-bot@production" selected>' in html
    assert 'data-base="tiny-llama"' in html and '<option value="tiny-llama"' in html
    assert 'data-endpoint="/v1/chat/completions"' in html


def test_adapters_without_a_ready_version_are_not_offered(
    signed_in, bob, adapter, good_adapter_dir
):
    make_version(adapter, good_adapter_dir, weights=b"broken")
    html = page(signed_in(bob).get("/playground/"))
    assert 'value="support-bot"' not in html
    assert '<option value="tiny-llama" selected>' in html
