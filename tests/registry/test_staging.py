"""The local adapter cache: whole folders only, sha256 verified, LRU within a byte budget,
versions behind an alias pinned."""

import os
import time

import pytest

from registry.errors import NotServable
from registry.models import AdapterVersion
from registry.services.aliases import alias_set
from registry.staging import ensure_staged, evict, version_dir
from tests.peft_adapters import make_peft_adapter
from tests.registry.conftest import ALICE_ACTOR, make_ready_version, sha256_of, upload

pytestmark = pytest.mark.django_db


@pytest.fixture(scope="module")
def adapter_dirs(tiny_base_dir, tmp_path_factory):
    return [
        make_peft_adapter(
            tiny_base_dir, tmp_path_factory.mktemp(f"a{i}"), rank=4, alpha=8, seed=10 + i
        )
        for i in range(3)
    ]


def age(folder, seconds):
    """Make a cache entry look as if last used `seconds` ago."""
    then = time.time() - seconds
    os.utime(folder, (then, then))


def test_a_staged_folder_holds_exactly_the_engines_two_files(adapter, good_adapter_dir):
    version = make_ready_version(adapter, good_adapter_dir)
    folder = ensure_staged(version)
    assert folder == version_dir(version)
    assert sorted(p.name for p in folder.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
    ]
    assert sha256_of(folder / "adapter_model.safetensors") == version.weights_sha256
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no temp leftovers
    assert ensure_staged(version) == folder  # a hit


def test_only_ready_versions_are_staged(adapter, good_adapter_dir, alice, user_client, settings):
    upload(user_client(alice), "support-bot", good_adapter_dir)
    with pytest.raises(NotServable, match="pending"):
        ensure_staged(AdapterVersion.objects.get())
    assert not settings.ADAPTER_CACHE_DIR.exists() or not any(settings.ADAPTER_CACHE_DIR.iterdir())


def test_a_damaged_staged_copy_is_fetched_again(adapter, good_adapter_dir):
    version = make_ready_version(adapter, good_adapter_dir)
    folder = ensure_staged(version)
    (folder / "adapter_model.safetensors").write_bytes(b"short")
    assert ensure_staged(version) == folder
    assert sha256_of(folder / "adapter_model.safetensors") == version.weights_sha256


def test_a_copy_a_concurrent_stager_put_in_place_is_never_replaced(
    adapter, good_adapter_dir, monkeypatch
):
    """The prefetcher and the engine's loader can stage one version at once: the one that
    finishes second keeps the first one's folder, which its caller may be reading now."""
    from registry import staging

    version = make_ready_version(adapter, good_adapter_dir)
    real_download = staging.download_version
    first: list[int] = []

    def download_while_another_finishes(v, tmp):
        if not first:  # the other stager completes while this one downloads
            monkeypatch.setattr(staging, "download_version", real_download)
            first.append(ensure_staged(v).stat().st_ino)
        return real_download(v, tmp)

    monkeypatch.setattr(staging, "download_version", download_while_another_finishes)
    folder = ensure_staged(version)
    assert folder.stat().st_ino == first[0]  # the same folder, not a replacement
    assert sha256_of(folder / "adapter_model.safetensors") == version.weights_sha256
    assert [p.name for p in folder.parent.iterdir()] == [folder.name]  # no temp leftovers


def test_eviction_skips_entries_other_stagers_removed_since_the_listing(
    adapter, good_adapter_dir, monkeypatch
):
    """A concurrent stager's temp folder (or an evicted copy) can vanish between the
    listing and its stat: the stager that evicts must not fail for it."""
    from pathlib import Path

    folder = ensure_staged(make_ready_version(adapter, good_adapter_dir))
    root = folder.parent
    real_iterdir = Path.iterdir

    def listing_with_vanished_entries(self):
        yield from real_iterdir(self)
        if self == root:
            yield root / ".gone.tmp"  # renamed into place by its stager meanwhile
            yield root / "gone"  # evicted by another process meanwhile

    monkeypatch.setattr(Path, "iterdir", listing_with_vanished_entries)
    assert evict(budget=0) == [folder.name]


def test_the_cache_evicts_least_recently_used_unpinned_versions(adapter, adapter_dirs, settings):
    versions = [make_ready_version(adapter, d) for d in adapter_dirs]
    folders = [ensure_staged(v) for v in versions[:2]]
    size = sum(f.stat().st_size for f in folders[0].iterdir())
    age(folders[0], 300)
    age(folders[1], 200)
    alias_set(
        adapter=adapter, name="production", version_number=versions[0].number, actor=ALICE_ACTOR
    )
    settings.ADAPTER_CACHE_BYTES = 2 * size + size // 2  # room for two
    third = ensure_staged(versions[2])
    # The oldest is pinned by production, so the next oldest goes.
    assert folders[0].exists() and not folders[1].exists() and third.exists()


def test_pinned_versions_stay_even_over_budget(adapter, adapter_dirs, settings):
    version = make_ready_version(adapter, adapter_dirs[0])
    folder = ensure_staged(version)
    alias_set(adapter=adapter, name="production", version_number=version.number, actor=ALICE_ACTOR)
    assert evict(budget=0) == []
    assert folder.exists()


def test_recently_used_versions_outlive_older_ones(adapter, adapter_dirs):
    versions = [make_ready_version(adapter, d) for d in adapter_dirs]
    folders = [ensure_staged(v) for v in versions]
    for i, folder in enumerate(folders):
        age(folder, 100 * (3 - i))
    ensure_staged(versions[0])  # a hit refreshes its place in the LRU order
    size = sum(f.stat().st_size for f in folders[0].iterdir())
    evicted = evict(budget=size)
    assert set(evicted) == {folders[1].name, folders[2].name}
    assert folders[0].exists()
