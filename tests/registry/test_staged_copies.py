"""A staged copy damaged on this host's disk heals: registry/staging.py checks a folder by its
files' stamps (stat calls) where every request asks, by sha256 where a stamp is wrong or
the engine could not load it, and stages a damaged copy again from object storage.

Before, a folder was checked by its files' sizes only: a same-size write to a staged file
went unseen for good, and the adapter stayed unservable until someone deleted the folder.
"""

import os
from pathlib import Path

import pytest

from registry import objectstore, staged_copies, staging
from registry.staging import StagingError, ensure_staged, is_staged, version_dir
from tests.peft_adapters import make_peft_adapter
from tests.registry.conftest import make_ready_version, sha256_of

pytestmark = pytest.mark.django_db
WEIGHTS = "adapter_model.safetensors"


def corrupt_in_place(path, *, keep_mtime: bool = False, at: int = -64) -> None:
    """Same size, other bytes: what a stray writer (or a failing disk) leaves."""
    path = Path(path)
    before = path.stat()
    with open(path, "r+b") as f:
        f.seek(at, os.SEEK_END)
        f.write(b"\xff" * 16)
    if keep_mtime:  # a writer that puts the time back: only the bytes tell
        os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size


@pytest.fixture
def restages():
    """The restage counters' growth during the test, by reason."""
    start = staged_copies.restage_counts()
    return lambda: {
        reason: count - start[reason]
        for reason, count in staged_copies.restage_counts().items()
        if count != start[reason]
    }


@pytest.fixture
def hashes(monkeypatch):
    """How many files staged_copies reads in full."""
    calls = []
    real = staged_copies.hash_stream

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(staged_copies, "hash_stream", counted)
    return calls


def test_a_same_size_write_is_seen_by_stat_and_restaged(adapter, good_adapter_dir, restages):
    version = make_ready_version(adapter, good_adapter_dir)
    folder = ensure_staged(version)
    assert is_staged(version)
    corrupt_in_place(folder / WEIGHTS)
    assert not is_staged(version)  # the request path now leaves it to the engine's loader
    assert ensure_staged(version) == folder
    assert sha256_of(folder / WEIGHTS) == version.weights_sha256
    assert is_staged(version)
    assert restages() == {"modified": 1}


def test_a_copy_whose_stamps_survive_is_restaged_when_its_load_fails(
    adapter, good_adapter_dir, restages, hashes
):
    version = make_ready_version(adapter, good_adapter_dir)
    folder = ensure_staged(version)
    corrupt_in_place(folder / WEIGHTS, keep_mtime=True)
    assert is_staged(version)  # stat calls cannot tell
    assert ensure_staged(version) == folder and hashes == []  # nor does a hit read the bytes
    assert ensure_staged(version, suspect=True) == folder  # the engine could not load it
    assert sha256_of(folder / WEIGHTS) == version.weights_sha256
    assert restages() == {"load_failed": 1}


def test_an_intact_copy_that_fails_to_load_is_hashed_once(
    adapter, good_adapter_dir, restages, hashes, monkeypatch
):
    """A version the engine refuses for another reason is not read in full on every try."""
    version = make_ready_version(adapter, good_adapter_dir)
    folder = ensure_staged(version)
    monkeypatch.setattr(staging, "download_version", lambda *a: pytest.fail("downloaded"))
    for _ in range(3):
        assert ensure_staged(version, suspect=True) == folder
    assert hashes == [] and restages() == {}  # staging hashed it on the way in


def test_a_copy_staged_before_stamps_is_verified_once_and_kept(
    adapter, good_adapter_dir, restages, hashes, monkeypatch
):
    version = make_ready_version(adapter, good_adapter_dir)
    folder = ensure_staged(version)
    for file in folder.iterdir():
        os.utime(file)  # as an older release left it: verified, never stamped
    assert not is_staged(version)
    monkeypatch.setattr(staging, "download_version", lambda *a: pytest.fail("downloaded"))
    assert ensure_staged(version) == folder
    assert len(hashes) == 2 and restages() == {}
    assert is_staged(version)  # stamped now


def test_a_truncated_file_is_a_size_restage(adapter, good_adapter_dir, restages):
    version = make_ready_version(adapter, good_adapter_dir)
    folder = ensure_staged(version)
    with open(folder / WEIGHTS, "r+b") as f:
        f.truncate(100)
    assert ensure_staged(version) == folder
    assert sha256_of(folder / WEIGHTS) == version.weights_sha256
    assert restages() == {"size": 1}


def test_a_version_whose_stored_copy_is_also_bad_fails_alone(
    adapter, good_adapter_dir, tiny_base_dir, tmp_path, restages
):
    other = make_ready_version(
        adapter, make_peft_adapter(tiny_base_dir, tmp_path / "other", rank=4, alpha=8, seed=7)
    )
    version = make_ready_version(adapter, good_adapter_dir)
    folders = [ensure_staged(v) for v in (version, other)]
    stored = objectstore.storage().path(version.weights_key)
    corrupt_in_place(stored)
    corrupt_in_place(folders[0] / WEIGHTS)
    with pytest.raises(StagingError) as refused:
        ensure_staged(version)
    assert "stored bytes changed since upload: adapter_model.safetensors has sha256" in str(
        refused.value
    )
    assert not version_dir(version).exists()  # the damaged copy is never read again
    assert [p.name for p in folders[0].parent.iterdir()] == [folders[1].name]  # no leftovers
    assert is_staged(other) and ensure_staged(other) == folders[1]  # the other one is untouched
    assert restages() == {"modified": 1}
