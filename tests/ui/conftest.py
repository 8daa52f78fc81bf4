"""Fixtures for the pages: the registry's tiny base model and real adapters, signed-in clients.

Object storage and the adapter cache stay the configured ones (under LORAPLEX_VAR_DIR), so
a real worker started by `live_worker` sees what these tests write.
"""

import io
from pathlib import Path

import pytest
from django.test import Client

from registry.services.versions import adapter_version_create, adapter_version_validate
from tests.conftest import signed_in_clients
from tests.registry.conftest import (  # noqa: F401  (fixtures, re-exported for these tests)
    ALICE_ACTOR,
    adapter,
    base_model,
    good_adapter_dir,
    second_adapter_dir,
    tiny_base_dir,
)


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    # alice, bob and charlie get passwords; the default hasher would dominate these tests.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def signed_in():
    """signed_in(user) -> a Django test client (pages, not the API) with that user's session."""
    return signed_in_clients(Client)


def make_version(of_adapter, folder: Path, *, weights: bytes | None = None, actor=ALICE_ACTOR):
    """A version created and validated in-process; `weights` replaces the safetensors bytes."""
    config = io.BytesIO((folder / "adapter_config.json").read_bytes())
    body = weights if weights is not None else (folder / "adapter_model.safetensors").read_bytes()
    version, _ = adapter_version_create(
        adapter=of_adapter, config=config, weights=io.BytesIO(body), actor=actor
    )
    adapter_version_validate(version_id=version.pk)
    version.refresh_from_db()
    return version


def page(response) -> str:
    return response.content.decode()
