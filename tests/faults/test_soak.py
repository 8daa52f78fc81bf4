"""A soak: eight tenants' mixed traffic through a live `serve` while its workers (started as
`make run` starts them: validation and the periodic tasks in one, evaluations in another) are
killed and restarted, Redis (broker, rate limits, announcements) is restarted empty, and a
ninth tenant attacks within its limits (tests/faults/attacks.py: a near-context prompt, an
echo bomb, megabyte tokenizations; tests/faults/evaluation_attack.py: the largest evaluation)
while a tenth measures what each costs it.

Each tenant streams, asks for structured output and tool calls, sends completions with
logprobs, disconnects mid-stream, makes a caller's mistakes and uploads versions with an eval
set (validated and scored on the engine by a real worker) for LORAPLEX_SOAK_SECONDS. After it:
every admitted request has exactly one usage record (the disconnected ones `aborted`), every
version has its verdict, the engine is idle (nothing running, no KV block held), and no
answer was a 5xx: nothing the callers sent, and none of the faults, is a server error. The
attacks are answered as their limits say, and the probing tenant's time to a first token
under each stays within its bound of its time without it, measured side by side: 3x beside
the long prompt, 1.5x beside the tokenizations (the echo bomb's is reported, not bounded);
beside the maximal evaluation, the tenth's upload is validated within 3x its time without it
(its first token is reported).
"""

import json
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.adapter_versions import create_ready_version
from tests.clients import chat, chat_stream, http, metric
from tests.faults.attacks import Siege, first_token_seconds, target_for
from tests.faults.evaluation_attack import EvalLimits, maximal_evaluation
from tests.faults.workers import kill, stop
from tests.inference.conftest import start_server, stop_server
from tests.peft_adapters import make_peft_adapter
from tests.processes import ROOT, database_url
from tests.registry.test_fair_queues import make_run_workers
from tests.tiny_llama import make_tiny_llama
from tests.trained_adapter import eval_set_jsonl, task_rows
from tests.waiting import HANG_GUARD_SECONDS, wait_for

BASE = "tiny-soak"
TOKEN = "soak-operator-token"
TENANTS = 8
UPLOADS_PER_TENANT = 2
SECONDS = float(os.environ.get("LORAPLEX_SOAK_SECONDS", "150"))
pytestmark = pytest.mark.django_db(transaction=True)  # the server and worker read committed rows

ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 12}},
    "required": ["answer"],
}
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 12}},
            "required": ["city"],
        },
    },
}
# A caller's mistakes, each answered 4xx without reaching the engine.
MISTAKES = [
    {"model": "no-such-model"},
    {"temperature": -1},
    {"max_tokens": "many"},
    {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "r", "schema": {"$ref": "#"}},
        }
    },
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}]},
]


@dataclass
class Outcome:
    tenant: int
    kind: str
    status: int  # 0: no answer at all (the connection failed)
    started: float
    ended: float
    endpoint: str = ""  # a usage record's: "chat.completions" or "completions", when admitted
    model: str = ""
    detail: str = ""


@pytest.fixture
def site(tmp_path):
    """The base model, eight tenants with a key, a served adapter each (`chat`, production
    alias) and one that takes uploads (`uploads`); upload folders made ahead."""
    from registry.services.adapters import adapter_create
    from registry.services.aliases import alias_set
    from registry.services.base_models import base_model_import
    from tenants.services import api_key_create, tenant_create

    base_dir = make_tiny_llama(tmp_path / "base")
    base_model_import(name=BASE, path=base_dir, default=True)
    keys, uploads = [], []
    for index in range(TENANTS):
        tenant = tenant_create(slug=f"soak-{index}")
        _, key = api_key_create(
            tenant=tenant, name="soak", scopes=["inference", "registry:read", "registry:write"]
        )
        keys.append(key)
        served = make_peft_adapter(
            base_dir, tmp_path / f"served-{index}", rank=4, seed=index, base_model_name=BASE
        )
        adapter = adapter_create(tenant=tenant, name="chat", actor="test")
        create_ready_version(adapter, served)
        alias_set(adapter=adapter, name="production", version_number=1, actor="test")
        adapter_create(tenant=tenant, name="uploads", actor="test")
        uploads.append(
            [
                make_peft_adapter(
                    base_dir,
                    tmp_path / f"upload-{index}-{n}",
                    rank=4,
                    seed=1000 + index * 10 + n,
                    base_model_name=BASE,
                )
                for n in range(UPLOADS_PER_TENANT + 1)  # one more: an upload while Redis is down
            ]
        )
    siege = {
        role: api_key_create(
            tenant=tenant_create(slug=f"siege-{role}"),
            name="siege",
            scopes=["inference", "registry:read", "registry:write"],
        )[1]
        for role in ("attacker", "probe")
    }
    # What the attacker and the prober upload (each time to a fresh adapter of theirs).
    siege_adapter = make_peft_adapter(
        base_dir, tmp_path / "siege-adapter", rank=4, seed=2000, base_model_name=BASE
    )
    return {
        "tmp": tmp_path,
        "keys": keys,
        "uploads": uploads,
        "siege": siege,
        "siege_adapter": siege_adapter,
    }


def start_run_workers(tmp: Path, name: str, env: dict[str, str]) -> list[subprocess.Popen]:
    """The workers `make run` starts (scripts/run-embedded.sh: their queues, pools and
    concurrency), beat in the one that takes the default queue, on the soak's database with
    `env` over this process's; each in its own process group (`kill` takes beat's child too)."""
    workers = []
    for args in make_run_workers():
        queues = args[args.index("-Q") + 1]
        log = tmp / f"{name}-{queues.replace(',', '-')}.log"
        beat = ["-B", "-s", str(log.with_suffix(".beat-schedule"))] if "celery" in queues else []
        with open(log, "a") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "platform_site", "worker", *args, *beat]
                + ["--without-heartbeat", "--without-gossip", "--without-mingle"]
                + ["-n", f"{log.stem}-{time.monotonic_ns()}@%h"],
                cwd=ROOT,
                env={**os.environ, "DATABASE_URL": database_url(), **env},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        workers.append(proc)
        wait_for(
            lambda: " ready." in log.read_text() or proc.poll() is not None,  # noqa: B023
            what=f"worker {log.stem} to start",
        )
        assert proc.poll() is None, log.read_text()
    return workers


class Tenant(threading.Thread):
    """One tenant's client: a random mix of requests until `until`, uploads spread over it."""

    def __init__(self, index: int, url: str, key: str, uploads: list[Path], until: float):
        super().__init__(name=f"tenant-{index}", daemon=True)
        self.index, self.url, self.key, self.until = index, url, key, until
        self.rng = random.Random(index)
        self.uploads = list(uploads)
        self.upload_at = [
            time.monotonic() + (until - time.monotonic()) * (n + 1) / (UPLOADS_PER_TENANT + 1)
            for n in range(UPLOADS_PER_TENANT)
        ]
        self.outcomes: list[Outcome] = []
        self.eval_rows = task_rows(seed=index, eval_n=3).eval

    def run(self) -> None:
        kinds = ["chat", "base", "stream", "disconnect", "structured", "tools", "text", "mistake"]
        while time.monotonic() < self.until:
            if self.upload_at and time.monotonic() >= self.upload_at[0]:
                self.upload_at.pop(0)
                self._record("upload", self._upload)
                continue
            kind = self.rng.choice(kinds)
            self._record(kind, getattr(self, f"_{kind}"))

    def upload_now(self) -> None:
        """An upload from another thread (the test's, while a fault is on)."""
        self._record("upload", self._upload)

    def _record(self, kind: str, call) -> None:
        started = time.monotonic()
        try:
            status, endpoint, model, detail = call()
        except httpx.HTTPError as exc:
            status, endpoint, model, detail = 0, "", "", f"{type(exc).__name__}: {exc}"
        self.outcomes.append(
            Outcome(self.index, kind, status, started, time.monotonic(), endpoint, model, detail)
        )

    @staticmethod
    def _admitted(response: httpx.Response, endpoint: str, model: str):
        ok = response.status_code == 200
        return response.status_code, endpoint if ok else "", model, response.text[-300:]

    def _chat(self):
        response = chat(self.url, self.key, model="chat", max_tokens=self.rng.randint(1, 12))
        return self._admitted(response, "chat.completions", "chat")

    def _base(self):
        response = chat(self.url, self.key, model=BASE, max_tokens=self.rng.randint(1, 12))
        return self._admitted(response, "chat.completions", BASE)

    def _structured(self):
        response_format = {
            "type": "json_schema",
            "json_schema": {"name": "answer", "schema": ANSWER_SCHEMA},
        }
        response = chat(
            self.url, self.key, model="chat", max_tokens=24, response_format=response_format
        )
        if response.status_code == 200 and response.json()["choices"][0]["finish_reason"] == "stop":
            json.loads(response.json()["choices"][0]["message"]["content"])  # valid, or fail
        return self._admitted(response, "chat.completions", "chat")

    def _tools(self):
        response = chat(
            self.url,
            self.key,
            model="chat",
            max_tokens=24,
            tools=[WEATHER_TOOL],
            tool_choice="required",
        )
        return self._admitted(response, "chat.completions", "chat")

    def _text(self):
        body = {"model": "chat", "prompt": "Once upon", "max_tokens": 6, "logprobs": 2, "n": 2}
        response = http(self.url, "POST", "/v1/completions", key=self.key, json=body)
        return self._admitted(response, "completions", "chat")

    def _stream(self):
        with chat_stream(self.url, self.key, model="chat", max_tokens=16) as response:
            lines = [line for line in response.iter_lines() if line]
        ok = response.status_code == 200 and lines[-1:] == ["data: [DONE]"]
        detail = "" if ok else "\n".join(lines[-3:])
        return response.status_code, "chat.completions", "chat", detail

    def _disconnect(self):
        with chat_stream(self.url, self.key, model="chat", max_tokens=400) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    break  # leaving the block closes the connection mid-answer
        return response.status_code, "chat.completions", "chat", "disconnected"

    def _mistake(self):
        body = {"model": "chat", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        body |= self.rng.choice(MISTAKES)
        response = http(self.url, "POST", "/v1/chat/completions", key=self.key, json=body)
        return response.status_code, "", "", response.text[-300:]

    def _upload(self):
        folder = self.uploads.pop(0)
        files = {
            "config": ("adapter_config.json", (folder / "adapter_config.json").read_bytes()),
            "weights": (
                "adapter_model.safetensors",
                (folder / "adapter_model.safetensors").read_bytes(),
            ),
            "eval": ("eval.jsonl", eval_set_jsonl(self.eval_rows)),
        }
        response = http(
            self.url, "POST", "/api/v1/adapters/uploads/versions/", key=self.key, files=files
        )
        return response.status_code, "", "", response.text[-300:]


def test_eight_tenants_through_worker_and_redis_restarts_lose_nothing_and_leak_nothing(
    site, private_redis
):
    from registry.models import AdapterVersion, Evaluation
    from tenants.models import UsageRecord

    tmp = site["tmp"]
    shared = {
        "REDIS_URL": private_redis.url,
        "CELERY_BROKER_URL": private_redis.url.replace("/0", "/1"),
    }
    shared |= {"LORAPLEX_OPERATOR_TOKEN": TOKEN, "LORAPLEX_BROKER_VISIBILITY_TIMEOUT": "60"}
    url, server, log = start_server(
        tmp,
        {
            **shared,
            "LORAPLEX_BASE_MODEL": BASE,
            "LORAPLEX_MAX_LORAS": "4",
            "LORAPLEX_MAX_CPU_LORAS": "8",
            "LORAPLEX_KV_CACHE_BYTES": str(16 * 1024 * 1024),
            "LORAPLEX_MAX_REQUEST_BYTES": str(1024 * 1024),  # the default: a 1 MB /tokenize
            # The attacks at full strength: what the probe measures is the engine's and the
            # server's fairness, not the token budget turning the attacker away.
            "LORAPLEX_RATE_LIMIT_TPM": str(10_000_000),
        },
        name="serve-soak",
    )
    worker_env = {
        **shared,
        "LORAPLEX_ENGINE_URLS": url,
        "LORAPLEX_SWEEP_INTERVAL_SECONDS": "5",
        "LORAPLEX_VALIDATION_DEADLINE_SECONDS": "45",
        "LORAPLEX_TASK_RETRY_BACKOFF_SECONDS": "0.5",
        "LORAPLEX_EVAL_RETRY_MAX_SECONDS": "2",
    }
    workers = [start_run_workers(tmp, "worker-0", worker_env)]
    start = time.monotonic()
    tenants = [
        Tenant(i, url, key, site["uploads"][i], until=start + SECONDS)
        for i, key in enumerate(site["keys"])
    ]
    probe_key = site["siege"]["probe"]
    target = target_for(url, site["siege"]["attacker"], BASE)
    # The server runs with the default eval-set limits (this process's settings): rows of a
    # full context each, the row limit binds before the token limit (LORAPLEX_EVAL_MAX_TOKENS).
    evaluation = maximal_evaluation(
        target,
        probe_key=probe_key,
        adapter_folder=site["siege_adapter"],
        limits=EvalLimits.of_settings(),
    )
    siege = Siege(
        target, probe=lambda: first_token_seconds(url, probe_key, BASE), more=[evaluation]
    )
    faults: list[tuple[str, float, float]] = []
    try:
        for tenant in tenants:
            tenant.start()
        siege.start()

        def at(share: float) -> None:
            time.sleep(max(0.0, start + SECONDS * share - time.monotonic()))

        def restart_worker(name: str) -> None:
            began = time.monotonic()
            for worker in workers[-1]:
                kill(worker)  # mid-task, or not: no word to the broker
            time.sleep(3)
            workers.append(start_run_workers(tmp, name, worker_env))
            faults.append((name, began, time.monotonic()))

        at(0.3)
        restart_worker("worker-1")
        at(0.5)
        began = time.monotonic()
        private_redis.kill()  # without persistence: queued tasks and counters are gone
        tenants[0].upload_now()  # its validation cannot be queued: the sweep finds it
        time.sleep(max(0.0, began + 3 - time.monotonic()))
        private_redis.start()
        faults.append(("redis", began, time.monotonic()))
        at(0.7)
        restart_worker("worker-2")
        for tenant in tenants:
            tenant.join(SECONDS + HANG_GUARD_SECONDS)
            assert not tenant.is_alive(), f"{tenant.name} hung"
        siege.join(SECONDS + HANG_GUARD_SECONDS)
        assert not siege.is_alive(), "the attacks hung"
        if siege.error is not None:
            raise siege.error
        print("soak attacks:", json.dumps([trial.summary() for trial in siege.trials]))
        outcomes = [o for tenant in tenants for o in tenant.outcomes]

        # ---- answered: every request, none with a 5xx; the mistakes were 4xx
        kinds = Counter(o.kind for o in outcomes)
        assert all(kinds[k] for k in ("stream", "disconnect", "structured", "tools", "upload")), (
            kinds
        )
        failed = [o for o in outcomes if not 200 <= o.status < 500]
        assert not failed, (faults, failed[:10])
        assert all(400 <= o.status < 500 for o in outcomes if o.kind == "mistake")
        assert all(o.status == 200 for o in outcomes if o.kind in ("stream", "disconnect"))
        broken = [o for o in outcomes if o.kind == "stream" and o.detail]
        assert not broken, broken[:5]
        uploads = [o for o in outcomes if o.kind == "upload"]
        assert [o.status for o in uploads] == [202] * len(uploads), uploads
        unexpected = {t.attack: t.unexpected for t in siege.trials if t.unexpected}
        assert not unexpected, (faults, unexpected)

        # ---- the engine back to idle: nothing running or waiting, no KV block held
        def idle() -> bool:
            names = ("loraplex_requests_running", "loraplex_requests_waiting")
            return all(metric(url, name) == 0 for name in (*names, "loraplex_kv_cache_blocks_used"))

        wait_for(idle, what="the engine back to idle")

        # ---- metered: each admitted request once, per tenant, endpoint and model
        admitted = Counter((o.tenant, o.endpoint, o.model) for o in outcomes if o.endpoint)
        aborted = Counter(o.tenant for o in outcomes if o.kind == "disconnect" and o.endpoint)

        def records() -> Counter:
            rows = UsageRecord.objects.filter(tenant__slug__startswith="soak-")
            return Counter(
                (int(r.tenant.slug.removeprefix("soak-")), r.endpoint, r.model)
                for r in rows.select_related("tenant")
            )

        wait_for(lambda: records() == admitted, what="one usage record per admitted request")
        time.sleep(1)  # nothing more arrives late
        assert records() == admitted
        got_aborted = Counter(
            int(slug.removeprefix("soak-"))
            for slug in UsageRecord.objects.filter(
                tenant__slug__startswith="soak-", status=UsageRecord.ABORTED
            ).values_list("tenant__slug", flat=True)
        )
        assert got_aborted == aborted

        # ---- no version without its verdict: validated, evaluated on the engine
        uploaded = AdapterVersion.objects.filter(
            adapter__tenant__slug__startswith="soak-", adapter__name="uploads"
        )

        def verdicts():
            versions = list(uploaded.all())  # a fresh query each time
            done = all(
                v.status in ("ready", "rejected") and v.quality not in ("pending",)
                for v in versions
            )
            unfinished = Evaluation.objects.filter(version__in=versions).exclude(
                status__in=Evaluation.FINISHED
            )
            return versions if done and not unfinished.exists() else None

        try:
            versions = wait_for(verdicts, what="verdicts", timeout=3 * HANG_GUARD_SECONDS)
        except AssertionError:
            left = [
                (v.number, v.adapter.tenant.slug, v.status, v.quality, v.quality_detail)
                for v in uploaded.select_related("adapter__tenant")
            ]
            evaluations = list(Evaluation.objects.values_list("version_id", "status", "attempts"))
            raise AssertionError(f"versions without a verdict: {left}; {evaluations}") from None
        assert len(versions) == len(uploads)
        assert {(v.status, v.quality) for v in versions} == {("ready", "passed")}, [
            (v.status, v.quality, v.quality_detail) for v in versions
        ]
        assert server.poll() is None
        assert "Traceback" not in log.read_text(), log.read_text()[-4000:]

        # ---- last, so one run checks all of the above: the attacks cost others little
        over = [trial.summary() for trial in siege.trials if not trial.held]
        assert not over, (over, [trial.summary() for trial in siege.trials])
    finally:
        for tenant in tenants:
            tenant.until = 0
        for worker in (w for started in workers for w in started):
            stop(worker)
        stop_server(server)
