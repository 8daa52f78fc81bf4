"""The disk filling up during an upload or an import: a clean 507 (this server's disk) or 503
(object storage), and nothing half-stored: no temp file, no partial object, no version row.

The disk is full for real only as far as the kernel's answer goes: the files are real
temporary files and storage files, written through the real upload view, and the write that
does not fit writes what fits, then fails with ENOSPC as write(2) does.
"""

import errno
import os
import tempfile
import types

import pytest
from django.core.files import uploadedfile
from django.core.files.storage import filesystem

from audit.models import AuditEvent
from registry import uploads
from registry.models import AdapterVersion
from tests.registry.conftest import stored_objects, upload

pytestmark = pytest.mark.django_db


class Disk:
    """A disk with `room` bytes left, shared by every file opened on it."""

    def __init__(self, room: int):
        self.room = room
        self.refused = 0

    def file(self, inner):
        return FileOnDisk(inner, self)


class FileOnDisk:
    def __init__(self, inner, disk: Disk):
        self._inner, self._disk = inner, disk

    def write(self, data):
        if len(data) > self._disk.room:
            self._inner.write(bytes(data[: self._disk.room]))
            self._disk.room = 0
            self._disk.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._disk.room -= len(data)
        return self._inner.write(data)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._inner.close()


@pytest.fixture
def client(adapter, alice, user_client):
    return user_client(alice)


@pytest.fixture
def spill_dir(settings, tmp_path):
    folder = tmp_path / "uploads"
    folder.mkdir()
    settings.FILE_UPLOAD_TEMP_DIR = str(folder)
    return folder


def assert_nothing_kept(*folders):
    assert AdapterVersion.objects.count() == 0
    assert not AuditEvent.objects.filter(verb="version.upload").exists()
    assert stored_objects() == []
    for folder in folders:
        assert list(folder.iterdir()) == [], folder


def test_a_full_disk_while_spilling_the_upload_is_507_and_leaves_no_temp_file(
    client, adapter, good_adapter_dir, spill_dir, monkeypatch
):
    disk = Disk(room=1500)  # the config fits, the weights do not
    real = tempfile.NamedTemporaryFile

    def on_disk(*args, **kwargs):
        spilled = real(*args, **kwargs)
        spilled.file = disk.file(spilled.file)
        return spilled

    monkeypatch.setattr(uploadedfile.tempfile, "NamedTemporaryFile", on_disk)
    response = upload(client, adapter.name, good_adapter_dir)
    assert response.status_code == 507, response.content
    error = response.json()["error"]
    assert error["code"] == "insufficient_storage"
    assert "ran out of disk space" in error["message"] and "nothing was kept" in error["message"]
    assert disk.refused == 1
    assert_nothing_kept(spill_dir)


def test_a_full_disk_under_local_object_storage_is_503_and_leaves_no_partial_object(
    client, adapter, good_adapter_dir, spill_dir, monkeypatch
):
    disk = Disk(room=2000)  # the config object fits, the weights object does not
    on_disk_os = types.SimpleNamespace(
        **{name: getattr(os, name) for name in dir(os) if not name.startswith("__")}
    )
    on_disk_os.fdopen = lambda fd, *a, **kw: disk.file(os.fdopen(fd, *a, **kw))
    monkeypatch.setattr(filesystem, "os", on_disk_os)

    response = upload(client, adapter.name, good_adapter_dir)
    assert response.status_code == 503, response.content
    assert response.json()["error"]["code"] == "storage_unavailable"
    assert "adapter_model.safetensors (OSError)" in response.json()["error"]["message"]
    assert disk.refused == 1
    assert_nothing_kept(spill_dir)


def test_a_full_disk_while_downloading_an_import_is_507_and_leaves_no_temp_file(
    client, s3, tenant_a, settings, good_adapter_dir, tmp_path, monkeypatch
):
    training = s3.create_bucket(f"training-{s3.bucket}")
    settings.S3_IMPORT_BUCKETS = [training]
    tenant_a.s3_import_prefixes = f"s3://{training}/"
    tenant_a.save()
    s3.put_folder(training, "run/", good_adapter_dir)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    disk = Disk(room=1500)
    monkeypatch.setattr(uploads, "open", lambda *a, **kw: disk.file(open(*a, **kw)), raising=False)  # noqa: SIM115

    response = client.post(
        "/api/v1/adapters/support-bot/versions/",
        {"source": f"s3://{training}/run/"},
        format="json",
    )
    assert response.status_code == 507, response.content
    assert response.json()["error"]["code"] == "insufficient_storage"
    assert disk.refused == 1
    assert_nothing_kept(scratch)
