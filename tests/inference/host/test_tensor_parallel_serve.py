"""`manage.py serve` with LORAPLEX_TENSOR_PARALLEL_SIZE=2 (two ranks, gloo on CPU), through
the real `openai` client: greedy answers for the base model and two adapters, served in one
mixed batch, equal a one-rank server's, and so do their logprobs within 1e-4, at prefill
(`prompt_logprobs`) and at every decode step (`top_logprobs`); killing rank 1 mid-stream, or
stopping it (alive and silent, failed once the step runs past LORAPLEX_TP_TIMEOUT_SECONDS),
ends the stream with an error, turns /readyz 503 and makes `serve` exit for its supervisor.
The tiny model's 2 KV heads give each rank one.
"""

import os
import signal
import socket
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

from inference.engine.parallel_workers import process_name
from inference.management.commands.serve import ENGINE_FAILED_EXIT_CODE
from tests.engine.lora_fixtures import ALL_LINEAR, ATTENTION
from tests.inference.conftest import drop_live_rows, server_env, start_server, stop_server
from tests.peft_adapters import make_peft_adapter
from tests.processes import ROOT, SERVE, free_port
from tests.tiny_llama import make_tiny_llama

# The servers read rows committed by the module's fixture; the tests only talk HTTP to them.
pytestmark = pytest.mark.django_db
BASE_NAME = "tiny-tp"
TENANT = "tp-serve-a"
ADAPTERS = {
    "tp-all-linear": {"rank": 8, "alpha": 16, "targets": ALL_LINEAR, "seed": 1},
    "tp-attention": {"rank": 4, "alpha": 8, "targets": ATTENTION, "seed": 2},
}
QUESTIONS = ["What is a prompt?", "Name the capital of France, then of Germany."]
TOP = 5
TOLERANCE = 1e-4
TP_TIMEOUT_SECONDS = 20


@dataclass
class TPData:
    tmp: Path
    key: str


@pytest.fixture(scope="module")
def tp_data(django_db_setup, django_db_blocker, tmp_path_factory):
    """A tenant with a key, the tiny base model, and two ready adapters behind `production`."""
    from registry.models import BaseModel
    from registry.services.adapters import adapter_create
    from registry.services.aliases import alias_set
    from registry.services.base_models import base_model_import
    from registry.services.versions import adapter_version_create, adapter_version_validate
    from tenants.services import api_key_create, tenant_create

    tmp = tmp_path_factory.mktemp("tp-serve")
    base_dir = make_tiny_llama(tmp / "base")
    with django_db_blocker.unblock():
        served = list(BaseModel.objects.filter(is_default=True).values_list("pk", flat=True))
        base, _ = base_model_import(name=BASE_NAME, path=base_dir, default=True)
        tenant = tenant_create(slug=TENANT, name="TP Serve A")
        _, key = api_key_create(tenant=tenant, name="all", scopes=["inference"])
        for name, kwargs in ADAPTERS.items():
            folder = make_peft_adapter(
                base_dir, tmp / name, std=0.3, base_model_name=BASE_NAME, **kwargs
            )
            adapter = adapter_create(tenant=tenant, name=name, actor="test")
            with (
                open(folder / "adapter_config.json", "rb") as c,
                open(folder / "adapter_model.safetensors", "rb") as w,
            ):
                version, _ = adapter_version_create(
                    adapter=adapter, config=c, weights=w, actor="test"
                )
            version = adapter_version_validate(version_id=version.pk)
            assert version.status == "ready", version.report
            alias_set(adapter=adapter, name="production", version_number=1, actor="test")
    yield TPData(tmp=tmp, key=key)
    with django_db_blocker.unblock():
        drop_live_rows([TENANT], base, previously_default=served)


def serve(data: TPData, ranks: int, name: str):
    """(url, process, log) of a ready `serve` with `ranks` ranks and its own adapter cache."""
    return start_server(
        data.tmp,
        {
            "LORAPLEX_BASE_MODEL": BASE_NAME,
            "LORAPLEX_TENSOR_PARALLEL_SIZE": str(ranks),
            "LORAPLEX_ADAPTER_CACHE_DIR": str(data.tmp / f"cache-{name}"),
            "LORAPLEX_TP_TIMEOUT_SECONDS": str(TP_TIMEOUT_SECONDS),
        },
        name=name,
    )


def client(url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=30)


@dataclass
class Answer:
    """What a greedy chat completion shows of the logits: the tokens it picked, the top
    logprobs at each of them, and the prompt's (keyed by token id)."""

    tokens: list[str]
    top: list[dict[str, float]]
    prompt: list[dict[str, float]]


def ask(url: str, key: str, model: str, question: str) -> Answer:
    reply = client(url, key).chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        max_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=TOP,
        extra_body={"prompt_logprobs": TOP, "ignore_eos": True},
    )
    logprobs, extra = reply.choices[0].logprobs, reply.model_extra
    assert logprobs is not None and logprobs.content is not None and extra is not None
    content, prompt = logprobs.content, extra["prompt_logprobs"]
    assert len(content) == 12 and prompt[0] is None
    return Answer(
        tokens=[t.token for t in content],
        top=[{alt.token: alt.logprob for alt in t.top_logprobs} for t in content],
        prompt=[{tid: v["logprob"] for tid, v in entry.items()} for entry in prompt[1:]],
    )


def answers(url: str, key: str) -> dict[tuple[str, str], Answer]:
    """Every model on every question, all sent at once: the adapters and the base model
    share batches, as they do under load."""
    asks = [(model, q) for model in (BASE_NAME, *ADAPTERS) for q in QUESTIONS]
    with ThreadPoolExecutor(len(asks)) as pool:
        futures = {a: pool.submit(ask, url, key, *a) for a in asks}
        return {a: f.result() for a, f in futures.items()}


def largest_difference(one: list[dict[str, float]], two: list[dict[str, float]]) -> float:
    """The largest |difference| of two runs' logprobs, which must rank the same tokens."""
    assert len(one) == len(two)
    worst = 0.0
    for a, b in zip(one, two, strict=True):
        assert a.keys() == b.keys()
        worst = max(worst, *(abs(a[k] - b[k]) for k in a))
    return worst


def test_serve_refuses_a_size_the_model_cannot_be_split_by(tp_data):
    env = server_env({"LORAPLEX_BASE_MODEL": BASE_NAME, "LORAPLEX_TENSOR_PARALLEL_SIZE": "3"})
    result = subprocess.run(
        [sys.executable, *SERVE, "--port", str(free_port())],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "CommandError: The engine failed to start: ConfigError: tensor_parallel_size 3 does "
        "not divide its 4 attention heads and its 2 KV heads (neither a multiple nor a "
        "divisor of 3) and its MLP width 128; choose a size that does "
        "(LORAPLEX_TENSOR_PARALLEL_SIZE)"
    )


def test_two_ranks_answer_as_one_for_the_base_model_and_each_adapter(tp_data):
    observed = {}
    for ranks in (1, 2):
        url, proc, _ = serve(tp_data, ranks, f"tp{ranks}")
        try:
            observed[ranks] = answers(url, tp_data.key)
        finally:
            stop_server(proc)
    one, two = observed[1], observed[2]
    worst = 0.0
    for asked, answer in one.items():
        assert two[asked].tokens == answer.tokens, asked
        worst = max(
            worst,
            largest_difference(answer.prompt, two[asked].prompt),
            largest_difference(answer.top, two[asked].top),
        )
    assert worst <= TOLERANCE
    # the adapters change what is said (else they would not be tested at all)
    for q in QUESTIONS:
        assert len({tuple(one[(m, q)].tokens) for m in (BASE_NAME, *ADAPTERS)}) == 3
    print(f"largest |TP=2 - TP=1| logprob difference: {worst:.2e}")


def children_named(pid: int, name: str) -> list[int]:
    """The child processes of `pid` whose name (as `ps -o comm` shows it) is `name`."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                status = dict(
                    line.split(":\t", 1) for line in (entry / "status").read_text().splitlines()
                )
            except (OSError, ValueError):
                continue  # exited meanwhile
            if status.get("PPid", "").strip() == str(pid) and status["Name"].strip() == name:
                found.append(int(entry.name))
    return found


def held_probe(url: str) -> socket.socket:
    """A /readyz request already connected and sent but for its one-byte body: once `serve`
    stops it closes its listener, and only requests in flight are still answered."""
    host, port = url.removeprefix("http://").split(":")
    probe = socket.create_connection((host, int(port)), timeout=30)
    probe.sendall(f"GET /readyz HTTP/1.1\r\nHost: {host}\r\nContent-Length: 1\r\n\r\n".encode())
    return probe


def answer_of(probe: socket.socket) -> tuple[int, str]:
    probe.sendall(b"x")
    received = b""
    while chunk := probe.recv(65536):
        received += chunk
    probe.close()
    head, _, body = received.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="finds rank 1 in /proc")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP], ids=["killed", "stopped"])
def test_a_lost_rank_ends_the_stream_turns_readiness_off_and_exits_serve(tp_data, sig):
    url, proc, log = serve(tp_data, 2, f"tp-{sig.name}")
    try:
        (rank_1,) = children_named(proc.pid, process_name(1))
        probe = held_probe(url)
        started, outcome = threading.Event(), []

        def read_stream():
            stream = client(url, tp_data.key).chat.completions.create(
                model="tp-all-linear",
                messages=[{"role": "user", "content": "Count to a thousand."}],
                max_tokens=400,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            try:
                for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        started.set()
                outcome.append("ended without an error")
            except openai.APIError as e:
                outcome.append(e)
            finally:
                started.set()

        reader = threading.Thread(target=read_stream, daemon=True)
        reader.start()
        assert started.wait(30), log.read_text()
        os.kill(rank_1, sig)
        reader.join(30 + TP_TIMEOUT_SECONDS)
        assert not reader.is_alive(), "the stream hangs after rank 1 died"
        (error,) = outcome
        assert isinstance(error, openai.APIError), error
        assert error.body["code"] == "engine_unavailable", error.body
        assert "the engine failed (RankFailedError)" in error.body["message"]

        status, body = answer_of(probe)
        assert status == 503, body
        assert '"engine"' in body

        assert proc.wait(timeout=30) == ENGINE_FAILED_EXIT_CODE
        output = log.read_text()
        if sig == signal.SIGKILL:
            assert f"tensor-parallel rank 1 (pid {rank_1}) exited with code -9" in output
        else:
            assert f"step did not finish within {TP_TIMEOUT_SECONDS} s" in output
        assert "exiting so that the supervisor starts a fresh process" in output
    finally:
        if proc.poll() is None:
            proc.kill()
