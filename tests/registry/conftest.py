"""Registry fixtures: a tiny real base model, real PEFT adapters, local or S3 (moto) storage.

Every test gets its own object store and adapter cache under tmp_path. Tests that need the
real Celery worker use `s3_worker`: it points this process and the worker (through the
environment it inherits) at one bucket on an in-process moto S3 server.
"""

import json
import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from registry.services.adapters import adapter_create
from registry.services.base_models import base_model_import
from tests.adapter_versions import create_ready_version
from tests.peft_adapters import make_peft_adapter
from tests.registry.peft_variants import make_variant
from tests.tiny_llama import make_tiny_llama
from tests.tiny_models import FAMILIES, make_tiny_model

BASE_NAME = "tiny-llama"
ALICE_ACTOR = "user:alice@example.com"


# ---------------------------------------------------------------- models and adapters (session)


@pytest.fixture(scope="session")
def tiny_base_dir(tmp_path_factory) -> Path:
    """2 layers, hidden 64, 4 heads, 2 KV heads: the base every registry test serves."""
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-base"))


@pytest.fixture(scope="session")
def good_adapter_dir(tiny_base_dir, tmp_path_factory) -> Path:
    return make_peft_adapter(
        tiny_base_dir, tmp_path_factory.mktemp("good"), rank=4, alpha=8, base_model_name=BASE_NAME
    )


@pytest.fixture(scope="session")
def second_adapter_dir(tiny_base_dir, tmp_path_factory) -> Path:
    """Different bytes for the same base: a second version."""
    return make_peft_adapter(
        tiny_base_dir,
        tmp_path_factory.mktemp("second"),
        rank=8,
        alpha=16,
        targets=("q_proj", "k_proj", "v_proj", "o_proj"),
        seed=1,
        base_model_name=BASE_NAME,
    )


# ---------------------------------------------------------------- model families (session)

# What PEFT can target in each family's checkpoint: Phi-3 fuses q/k/v and gate/up.
PHI3_TARGETS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")
SEVEN_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def targets_of(family: str) -> tuple[str, ...]:
    """Every linear projection of a layer of `family`, as PEFT names it."""
    return PHI3_TARGETS if family == "phi3" else SEVEN_TARGETS


@pytest.fixture(scope="session")
def family_base_dir(tmp_path_factory):
    """family_base_dir(family) -> the tiny model of that family (tests/tiny_models.py), made
    once per session: each family has its own shapes, as real checkpoints do."""
    made: dict[str, Path] = {}

    def get(family: str) -> Path:
        assert family in FAMILIES, family
        if family not in made:
            made[family] = make_tiny_model(tmp_path_factory.mktemp(f"tiny-{family}"), family)
        return made[family]

    return get


@pytest.fixture(scope="session")
def variant_dir(family_base_dir, tmp_path_factory):
    """variant_dir(family, variant) -> a real PEFT adapter of that variant
    (tests/registry/peft_variants.py) for that family's tiny model, made once per session."""
    made: dict[tuple[str, str], Path] = {}

    def get(family: str, variant: str) -> Path:
        if (family, variant) not in made:
            out = tmp_path_factory.mktemp(f"{family}-{variant}")
            made[(family, variant)] = make_variant(family_base_dir(family), out, family, variant)
        return made[(family, variant)]

    return get


# ---------------------------------------------------------------- storage


@pytest.fixture(autouse=True)
def registry_settings(settings, tmp_path):
    """A private local object store and adapter cache per test, and a fast password hasher."""
    settings.STORAGES = {
        **settings.STORAGES,
        "default": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "objects")},
        },
    }
    settings.ADAPTER_CACHE_DIR = tmp_path / "adapter-cache"
    settings.MAX_LORA_RANK = 64
    # alice, bob and charlie get passwords; a slow hasher would dominate these tests.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    return settings


def stored_objects() -> list[str]:
    """Every key in the default storage, local folder or bucket."""
    from django.core.files.storage import FileSystemStorage, storages

    backend = storages["default"]
    if hasattr(backend, "bucket"):
        return sorted(obj.key for obj in backend.bucket.objects.all())
    assert isinstance(backend, FileSystemStorage), backend
    root = Path(backend.location)
    if not root.exists():
        return []
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@dataclass
class S3:
    endpoint: str
    bucket: str
    client: Any  # a boto3 S3 client; boto3 ships no types

    def create_bucket(self, name: str) -> str:
        self.client.create_bucket(Bucket=name)
        return name

    def put_folder(self, bucket: str, prefix: str, folder: Path, files=None) -> None:
        for name in files or ("adapter_config.json", "adapter_model.safetensors"):
            self.client.put_object(
                Bucket=bucket, Key=prefix + name, Body=(folder / name).read_bytes()
            )


@pytest.fixture(scope="session")
def moto_endpoint():
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one line per S3 request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def s3(moto_endpoint, settings, monkeypatch, tmp_path) -> S3:
    """A fresh bucket on the moto server as the default storage, here and in any worker."""
    import boto3

    bucket = f"loraplex-{uuid.uuid4().hex[:12]}"
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_S3_ENDPOINT_URL": moto_endpoint,
        "LORAPLEX_S3_BUCKET": bucket,
        "LORAPLEX_ADAPTER_CACHE_DIR": str(tmp_path / "adapter-cache"),
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    client = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=bucket)
    settings.STORAGES = {
        **settings.STORAGES,
        "default": {
            "BACKEND": "storages.backends.s3.S3Storage",
            "OPTIONS": {
                "bucket_name": bucket,
                "endpoint_url": moto_endpoint,
                "region_name": "us-east-1",
                "addressing_style": "path",
                "file_overwrite": False,
                "default_acl": None,
            },
        },
    }
    settings.S3_BUCKET = bucket
    settings.S3_IMPORT_ENDPOINT_URL = moto_endpoint
    return S3(endpoint=moto_endpoint, bucket=bucket, client=client)


@pytest.fixture
def s3_worker(s3, live_worker):
    """The real Celery worker, started after `s3` so it inherits the bucket's environment."""
    return live_worker


# ---------------------------------------------------------------- registry rows


@pytest.fixture
def base_model(db, tiny_base_dir):
    return base_model_import(name=BASE_NAME, path=tiny_base_dir, default=True)[0]


@pytest.fixture
def adapter(tenant_a, base_model):
    return adapter_create(tenant=tenant_a, name="support-bot", actor=ALICE_ACTOR)


# ---------------------------------------------------------------- helpers


def files_of(folder: Path | None, **replace) -> dict:
    """Multipart body for an upload: {"config": file, "weights": file}, bytes overridable.

    `folder` may be None when `replace` gives both.
    """
    from django.core.files.uploadedfile import SimpleUploadedFile

    config = replace.get("config")
    if config is None:
        assert folder is not None, "no config given and no folder to read it from"
        config = (folder / "adapter_config.json").read_bytes()
    weights = replace.get("weights")
    if weights is None:
        assert folder is not None, "no weights given and no folder to read them from"
        weights = (folder / "adapter_model.safetensors").read_bytes()
    return {
        "config": SimpleUploadedFile("adapter_config.json", config),
        "weights": SimpleUploadedFile(
            replace.get("weights_name", "adapter_model.safetensors"), weights
        ),
    }


def upload(client, name: str, folder: Path | None, **replace):
    return client.post(
        f"/api/v1/adapters/{name}/versions/", files_of(folder, **replace), format="multipart"
    )


def sha256_of(path: Path) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def read_config(folder: Path) -> dict:
    return json.loads((folder / "adapter_config.json").read_text())


def env_flag(name: str) -> bool:
    return os.environ.get(name) == "1"


def make_ready_version(adapter, folder: Path, actor: str = ALICE_ACTOR):
    """A version created and validated in-process (the worker's service, called directly)."""
    return create_ready_version(adapter, folder, actor=actor)


# ---------------------------------------------------------------- the quality gate


@dataclass
class FakeScorer:
    """Stands in for the engine's scoring call (`score_on_engine`, as the evaluation service
    imports it): answers the engine's shape with the perplexities set here.

    `adapter_ppl` maps a version's uid (str) to its perplexity (`default_ppl` otherwise),
    `base_ppl` is the base model's; `revision` (default: the served base model's current
    one) is the revision the engine says it serves; `error`, when set, is raised instead.
    """

    adapter_ppl: dict = field(default_factory=dict)
    default_ppl: float = 9.0
    base_ppl: float = 30.0
    revision: str | None = None
    error: Exception | None = None
    calls: list = field(default_factory=list)

    def __call__(self, version_uid, rows, *, timeout=None):
        import math

        from registry.models import BaseModel

        self.calls.append((str(version_uid), len(rows)))
        if self.error is not None:
            raise self.error
        ppl = self.adapter_ppl.get(str(version_uid), self.default_ppl)
        revision = self.revision or BaseModel.objects.get(is_default=True).revision
        tokens = 4
        per_row = [
            {
                "tokens": tokens,
                "adapter_nll": tokens * math.log(ppl),
                "base_nll": tokens * math.log(self.base_ppl),
            }
            for _ in rows
        ]
        total = tokens * len(rows)
        return {
            "adapter_version": str(version_uid),
            "base_revision": revision,
            "rows": per_row,
            "adapter": {"tokens": total, "nll": math.log(ppl), "perplexity": ppl},
            "base": {"tokens": total, "nll": math.log(self.base_ppl), "perplexity": self.base_ppl},
        }


@pytest.fixture
def scorer(monkeypatch) -> FakeScorer:
    from registry.services import evaluations

    fake = FakeScorer()
    monkeypatch.setattr(evaluations, "score_on_engine", fake)
    return fake


@pytest.fixture
def worker_clock(monkeypatch) -> list[float]:
    """The evaluation task's clock, moved by each retry's countdown as a worker would wait it
    out (a task run eagerly, as `run_evaluations` runs it, does not wait). Returns the
    countdowns, in order."""
    from types import SimpleNamespace

    from registry import tasks

    now = {"t": 1_700_000_000.0}
    pauses: list[float] = []
    real_retry_later = tasks.retry_later

    def retry_later(task, exc, countdown=None, **kwargs):
        pauses.append(countdown)
        now["t"] += countdown
        real_retry_later(task, exc, countdown, **kwargs)

    monkeypatch.setattr(tasks, "time", SimpleNamespace(time=lambda: now["t"]))
    monkeypatch.setattr(tasks, "retry_later", retry_later)
    return pauses


def run_evaluations() -> list:
    """Run every queued evaluation through the worker's task, in this process (eagerly, as
    the queue would hand them out: oldest first). Returns the evaluations, refreshed."""
    from registry.models import Evaluation
    from registry.tasks import evaluate_adapter_version

    queued = list(Evaluation.objects.filter(status="queued").order_by("pk"))
    for evaluation in queued:
        evaluate_adapter_version.apply(args=[evaluation.pk])
        evaluation.refresh_from_db()
    return queued


def attach_eval_set(adapter, rows=None, actor: str = ALICE_ACTOR):
    """The adapter's own eval set (default: two prompt rows)."""
    import io

    from registry.services.eval_sets import eval_set_attach

    rows = rows or [
        {"prompt": "2 + 2 =", "completion": " 4"},
        {"prompt": "The capital of France is", "completion": " Paris."},
    ]
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    return eval_set_attach(adapter=adapter, file=io.BytesIO(data), actor=actor)[0]
