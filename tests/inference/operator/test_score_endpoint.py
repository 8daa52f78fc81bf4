"""The quality gate's scoring endpoint, `POST /v1/internal/score` (inference/operator/scoring.py),
and the control plane's client of it (registry/engines.py `score_on_engine`).

- In process, without an engine (LORAPLEX_ENGINE=off): routing, operator authorisation and
  every bad body, each a 400 naming its field, all answered before the engine is asked for.
- Against a live `manage.py serve` with the tiny model and a real PEFT adapter: the figures
  equal a transformers (+ PEFT) computation; unknown and unservable versions and overlong
  rows are refused with nothing reaching the engine; the client finds an engine that answers.
- In process with an AsyncLLMEngine: a tenant's stream gets a token at every engine step
  while evaluation traffic runs, so scoring never delays it by more than the step under way.
"""

import asyncio
import json
import math
import threading
import time
import uuid
import warnings

import httpx
import pytest
import torch
from django.contrib.auth.models import Permission
from django.test import Client
from django.urls import resolve
from peft import PeftModel
from transformers import AutoModelForCausalLM, AutoTokenizer

from inference.engine import AsyncLLMEngine, EngineRequest, SamplingParams
from inference.operator import scoring
from inference.operator import views as operator_views
from platform_site import operator_protocol as protocol
from registry import engines
from tests.clients import metric
from tests.engine.lora_fixtures import lora_engine, request_for
from tests.inference.conftest import BASE_NAME, start_server, stop_server
from tests.processes import free_port

# The live server reads rows committed by serve_data (tests/inference/conftest.py).
pytestmark = pytest.mark.django_db
TOKEN = "score-operator-token"
PATH = protocol.path(protocol.SCORE)
CHAT_ROW = {
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "completion": "Paris is the capital of France.",
}
TEXT_ROW = {"prompt": "The quick brown fox", "completion": " jumps over the lazy dog."}
SOME_UID = "0f0f0f0f-0f0f-4f0f-8f0f-0f0f0f0f0f0f"


# ---------------------------------------------------------------- in process, no engine


@pytest.fixture
def no_engine(settings):
    settings.ENGINE_ENABLED = False
    settings.OPERATOR_TOKEN = TOKEN


def post(body, token: str | None = TOKEN, raw: bytes | None = None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    data = raw if raw is not None else json.dumps(body)
    return Client().post(PATH, data, content_type="application/json", headers=headers)


def test_the_route_is_the_scoring_view():
    assert PATH == "/v1/internal/score"
    assert resolve(PATH).func is operator_views.score


def test_it_needs_the_operator_token(no_engine):
    body = {"adapter_version": None, "rows": [TEXT_ROW]}
    missing = post(body, token=None)
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_api_key"
    wrong = post(body, token="guess")
    assert wrong.status_code == 403 and wrong.json()["error"]["code"] == "operator_only"
    # past authorisation and the body, the engine is asked for: there is none here
    answered = post(body)
    assert answered.status_code == 503
    assert answered.json()["error"]["code"] == "engine_unavailable"


def test_a_staff_session_needs_the_permission_and_the_csrf_token(no_engine, django_user_model):
    user = django_user_model.objects.create_user("ops", password="pw", is_staff=True)
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    body = json.dumps({"adapter_version": None, "rows": [TEXT_ROW]})
    refused = client.post(PATH, body, content_type="application/json")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "operator_only"

    user.user_permissions.add(Permission.objects.get(codename="operate_engines"))
    forged = client.post(PATH, body, content_type="application/json")
    assert forged.status_code == 403 and forged.json()["error"]["code"] == "csrf_failed"
    client.get("/admin/")  # sets the CSRF cookie, as a page of the site does in a browser
    headers = {"X-CSRFToken": client.cookies["csrftoken"].value}
    answered = client.post(PATH, body, content_type="application/json", headers=headers)
    assert answered.status_code == 503  # an operator: no engine runs here


def test_only_post(no_engine):
    response = Client().get(PATH, headers={"Authorization": f"Bearer {TOKEN}"})
    assert response.status_code == 405 and response["Allow"] == "POST"


def rows(*extra, **fields):
    return {"adapter_version": SOME_UID, "rows": [TEXT_ROW, *extra], **fields}


BAD_BODIES = [
    # (body, code, param, words in the message)
    (b"{not json", "invalid_json", None, "not valid JSON"),
    (b"[1, 2]", "invalid_json", None, "JSON object"),
    ({"rows": [TEXT_ROW]}, "invalid_request", "adapter_version", "required"),
    ({"adapter_version": 7, "rows": [TEXT_ROW]}, "invalid_request", "adapter_version", "UUID"),
    ({"adapter_version": "v1", "rows": [TEXT_ROW]}, "invalid_request", "adapter_version", "UUID"),
    (rows(model="x"), "unknown_parameter", "model", "Unknown field 'model'"),
    ({"adapter_version": None}, "invalid_request", "rows", "non-empty list"),
    ({"adapter_version": None, "rows": {"0": TEXT_ROW}}, "invalid_request", "rows", "list"),
    ({"adapter_version": None, "rows": []}, "invalid_request", "rows", "non-empty list"),
    (rows("row"), "invalid_request", "rows[1]", "object"),
    (rows({**TEXT_ROW, "weight": 2}), "unknown_parameter", "rows[1].weight", "unknown field"),
    (rows({**TEXT_ROW, **CHAT_ROW}), "invalid_request", "rows[1]", "either messages or prompt"),
    (rows({"completion": "x"}), "invalid_request", "rows[1]", "either messages or prompt"),
    (rows({"prompt": "", "completion": "x"}), "invalid_request", "rows[1].prompt", "non-empty"),
    (rows({"prompt": [5, 6], "completion": "x"}), "invalid_request", "rows[1].prompt", "string"),
    (rows({"prompt": "p"}), "invalid_request", "rows[1].completion", "non-empty string"),
    (rows({"prompt": "p", "completion": ""}), "invalid_request", "rows[1].completion", "non-empty"),
    (rows({"prompt": "p", "completion": 3}), "invalid_request", "rows[1].completion", "string"),
    (
        rows({"messages": [], "completion": "x"}),
        "invalid_request",
        "rows[1].messages",
        "rows[1].messages must be a non-empty list",
    ),
    (
        rows({"messages": [{"role": "robot", "content": "hi"}], "completion": "x"}),
        "invalid_request",
        "rows[1].messages[0].role",
        "must be one of",
    ),
    (
        rows({"messages": [{"role": "user", "content": " "}], "completion": "x"}),
        "invalid_request",
        "rows[1].messages[0].content",
        "must not be empty",
    ),
]


@pytest.mark.parametrize(("body", "code", "param", "words"), BAD_BODIES)
def test_a_bad_body_is_a_400_naming_the_field(no_engine, body, code, param, words):
    response = post(None, raw=body) if isinstance(body, bytes) else post(body)
    assert response.status_code == 400, response.content  # not 503: the engine was not asked
    error = response.json()["error"]
    assert error["code"] == code and error.get("param") == param
    assert words in error["message"]


def test_rows_are_bounded_by_eval_max_rows(no_engine, settings):
    too_many = {"adapter_version": None, "rows": [TEXT_ROW] * (scoring.DEFAULT_MAX_ROWS + 1)}
    response = post(too_many)
    assert response.status_code == 400 and response.json()["error"]["param"] == "rows"
    assert "at most 200" in response.json()["error"]["message"]

    settings.EVAL_MAX_ROWS = 3
    assert post({"adapter_version": None, "rows": [TEXT_ROW] * 4}).status_code == 400
    assert post({"adapter_version": None, "rows": [TEXT_ROW] * 3}).status_code == 503


# ---------------------------------------------------------------- live


@pytest.fixture(scope="module")
def score_server(serve_data):
    url, proc, log = start_server(serve_data["tmp"], {"LORAPLEX_OPERATOR_TOKEN": TOKEN})
    yield url
    stop_server(proc)
    assert "Traceback" not in log.read_text(), log.read_text()[-4000:]


@pytest.fixture(scope="module")
def versions(serve_data, django_db_blocker):
    """Tenant A's ready `pirate` v1, and two rows the engine must refuse to score: v2 pending,
    v3 ready but checked against another revision of the base model."""
    from registry.models import AdapterVersion, BaseModel

    with django_db_blocker.unblock():  # committed: the live server reads them
        v1 = AdapterVersion.objects.get(
            adapter__tenant__slug="serve-a", adapter__name="pirate", number=1
        )
        unservable = {}
        for number, fields in (
            (2, {"status": AdapterVersion.PENDING}),
            (3, {"status": AdapterVersion.READY, "compatible": True, "checked_revision": "0" * 64}),
        ):
            unservable[number] = AdapterVersion.objects.create(
                adapter=v1.adapter,
                number=number,
                source="upload",
                config_key="unused",
                weights_key="unused",
                config_sha256=f"{number}" * 64,
                weights_sha256=f"{number}" * 64,
                config_size=1,
                weights_size=1,
                created_by="test",
                **fields,
            )
        revision = BaseModel.objects.get(name=BASE_NAME).revision
    return {
        "v1": str(v1.uid),
        "pending": str(unservable[2].uid),
        "stale": str(unservable[3].uid),
        "revision": revision,
    }


def call(url: str, body, token: str | None = TOKEN) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(f"{url}{PATH}", json=body, headers=headers, timeout=120)


@pytest.fixture(scope="module")
def reference(serve_data):
    """The rows' completion NLL by transformers (base) and PEFT (the adapter), fp32, with the
    prompts as /v1/chat/completions and /v1/completions render them and ChatML's end of turn
    after the chat row's completion."""
    base_dir, adapter_dir = serve_data["base_dir"], serve_data["adapter_dir"]
    tokenizer = AutoTokenizer.from_pretrained(base_dir)
    chat_prompt = tokenizer.apply_chat_template(
        CHAT_ROW["messages"], add_generation_prompt=True, tokenize=False
    )
    encoded = [
        (
            tokenizer(chat_prompt, add_special_tokens=False).input_ids,
            tokenizer(CHAT_ROW["completion"], add_special_tokens=False).input_ids
            + [tokenizer.convert_tokens_to_ids("<|im_end|>")],
        ),
        (
            tokenizer(TEXT_ROW["prompt"]).input_ids,
            tokenizer(TEXT_ROW["completion"], add_special_tokens=False).input_ids,
        ),
    ]
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32).eval()
    with warnings.catch_warnings():  # transformers' deprecation notes about PEFT's calls
        warnings.simplefilter("ignore", FutureWarning)
        tuned = PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32), adapter_dir
        ).eval()
    out = {"tokens": [len(c) for _, c in encoded]}
    for name, model in (("base", base), ("adapter", tuned)):
        nlls = []
        for prompt_ids, completion_ids in encoded:
            with torch.no_grad():
                logits = model(torch.tensor([prompt_ids + completion_ids])).logits[0]
            logprobs = logits.log_softmax(-1)[len(prompt_ids) - 1 : -1]
            nlls.append(-logprobs.gather(1, torch.tensor(completion_ids)[:, None]).sum().item())
        out[name] = nlls
    return out


def test_the_figures_equal_transformers_and_peft(score_server, versions, reference):
    response = call(score_server, {"adapter_version": versions["v1"], "rows": [CHAT_ROW, TEXT_ROW]})
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["base_revision"] == versions["revision"]
    assert body["adapter_version"] == versions["v1"]
    assert [r["tokens"] for r in body["rows"]] == reference["tokens"]
    tokens = sum(reference["tokens"])
    for name in ("adapter", "base"):
        got = [r[f"{name}_nll"] for r in body["rows"]]
        assert got == pytest.approx(reference[name], abs=1e-3)
        mean = sum(reference[name]) / tokens
        assert body[name]["tokens"] == tokens
        assert body[name]["nll"] == pytest.approx(mean, abs=1e-3)
        assert body[name]["perplexity"] == pytest.approx(math.exp(mean), rel=1e-3)
    # the adapter (random, strong) changes the figures: it really ran
    assert abs(body["adapter"]["nll"] - body["base"]["nll"]) > 0.01

    alone = call(score_server, {"adapter_version": None, "rows": [CHAT_ROW, TEXT_ROW]}).json()
    assert alone["adapter"] is None and alone["adapter_version"] is None
    assert [r["adapter_nll"] for r in alone["rows"]] == [None, None]
    assert alone["base"]["nll"] == pytest.approx(body["base"]["nll"], abs=1e-4)


def test_refusals_reach_nothing_of_the_engine(score_server, versions):
    before = metric(score_server, "loraplex_prompt_tokens_total")
    text = {"adapter_version": None, "rows": [TEXT_ROW]}
    missing = call(score_server, text, token=None)
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_api_key"
    wrong = call(score_server, text, token="guess")
    assert wrong.status_code == 403 and wrong.json()["error"]["code"] == "operator_only"
    refused = [
        ({"adapter_version": None, "rows": "all"}, 400, "invalid_request", "rows", "list"),
        (
            {"adapter_version": str(uuid.uuid4()), "rows": [TEXT_ROW]},
            404,
            "model_not_found",
            "adapter_version",
            "does not exist",
        ),
        (
            {"adapter_version": versions["pending"], "rows": [TEXT_ROW]},
            409,
            "model_not_servable",
            "adapter_version",
            "it is pending, not ready",
        ),
        (
            {"adapter_version": versions["stale"], "rows": [TEXT_ROW]},
            409,
            "model_not_servable",
            "adapter_version",
            f"not checked compatible with revision {versions['revision'][:12]}",
        ),
    ]
    for text_ in ("zq" * 1000, "zq" * 5000):  # too many tokens; too many characters
        overlong = {"prompt": text_, "completion": "x"}
        body = {"adapter_version": versions["v1"], "rows": [TEXT_ROW, overlong]}
        refused.append((body, 400, "context_length_exceeded", "rows[1]", "at most"))
    for body, status, code, param, words in refused:
        response = call(score_server, body)
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert (error["code"], error.get("param")) == (code, param) and words in error["message"]
    assert metric(score_server, "loraplex_prompt_tokens_total") == before  # the engine ran nothing


def test_the_client_scores_on_the_first_engine_that_answers(score_server, versions, settings):
    settings.OPERATOR_TOKEN = TOKEN
    dead = f"http://127.0.0.1:{free_port()}"
    settings.ENGINE_URLS = [dead, score_server]
    answer = engines.score_on_engine(uuid.UUID(versions["v1"]), [TEXT_ROW])
    assert answer["adapter_version"] == versions["v1"] and answer["rows"][0]["tokens"] > 0

    with pytest.raises(engines.ScoringFailed) as bad_row:
        engines.score_on_engine(versions["v1"], [{"prompt": "p"}])
    assert not bad_row.value.retryable and "rows[0].completion" in str(bad_row.value)

    settings.ENGINE_URLS = [dead]
    with pytest.raises(engines.ScoringFailed) as nobody:
        engines.score_on_engine(None, [TEXT_ROW], timeout=5)
    assert nobody.value.retryable and dead in str(nobody.value)
    assert "unreachable" in str(nobody.value)

    settings.ENGINE_URLS, settings.OPERATOR_TOKEN = [score_server], ""
    with pytest.raises(engines.ScoringFailed) as anonymous:
        engines.score_on_engine(None, [TEXT_ROW])
    assert not anonymous.value.retryable and anonymous.value.failures[0].status == 401


def test_the_client_splits_the_rows_over_requests_within_the_limits(
    score_server, versions, settings
):
    settings.OPERATOR_TOKEN, settings.ENGINE_URLS = TOKEN, [score_server]
    rows = [CHAT_ROW, TEXT_ROW, {**TEXT_ROW, "completion": " sleeps. Ünïcödé 日本語"}]
    whole = engines.score_on_engine(versions["v1"], rows)
    splits = []
    settings.EVAL_MAX_ROWS = 1  # a row a request
    assert [len(batch) for batch in engines._batches(rows)] == [1, 1, 1]
    splits.append(engines.score_on_engine(versions["v1"], rows))
    settings.EVAL_MAX_ROWS, settings.MAX_REQUEST_BYTES = 200, 1024 + 250  # by the bytes
    assert len(engines._batches(rows)) == 2
    splits.append(engines.score_on_engine(versions["v1"], rows))
    for split in splits:
        assert [r["tokens"] for r in split["rows"]] == [r["tokens"] for r in whole["rows"]]
        for name in ("adapter", "base"):
            got, expected = split[name], whole[name]
            assert got["tokens"] == expected["tokens"]
            assert got["nll"] == pytest.approx(expected["nll"], abs=1e-4)
            assert got["perplexity"] == pytest.approx(expected["perplexity"], rel=1e-4)
            assert [r[f"{name}_nll"] for r in split["rows"]] == pytest.approx(
                [r[f"{name}_nll"] for r in whole["rows"]], abs=1e-4
            )


def test_without_engine_urls_the_client_calls_the_embedded_default(settings, monkeypatch):
    settings.ENGINE_URLS = []
    embedded = f"http://127.0.0.1:{free_port()}"  # where `make run`'s serve would listen
    monkeypatch.setattr(engines, "EMBEDDED_ENGINE_URL", embedded)
    with pytest.raises(engines.ScoringFailed) as caught:
        engines.score_on_engine(None, [TEXT_ROW], timeout=5)
    assert [f.engine for f in caught.value.failures] == [embedded]
    assert caught.value.retryable


# ---------------------------------------------------------------- tenants first


STREAM_TOKENS = 120


@pytest.mark.parametrize("first", ["stream", "scoring"])
def test_scoring_never_delays_a_tenant_stream_by_more_than_one_step(serve_data, first) -> None:
    """Every engine step that runs while the tenant's request is in the engine gives it a
    token, the first included, while the evaluation's requests (adapter and base, chunked
    prefills at background priority) wait: they join a step only where a prefill makes room
    (background_tokens_per_step), never one of the tenant's decodes alone."""
    llm = lora_engine(serve_data["base_dir"], max_num_batched_tokens=32, max_num_seqs=6)
    steps: list[dict] = []
    real_step = llm.step

    def recorded_step():
        before, held = llm.num_steps, set(llm.requests)
        outputs = real_step()
        if llm.num_steps > before:
            assert llm.num_steps == before + 1
            steps.append(
                {
                    "held": held,
                    "tokens": {o.request_id for o in outputs if o.new_token_ids},
                    "finished": {o.request_id for o in outputs if o.finished},
                }
            )
        return outputs

    llm.step = recorded_step  # type: ignore[method-assign]
    lora = request_for("pirate", serve_data["adapter_dir"])
    rows = [
        scoring.TokenizedRow(
            [3 + (i * 37 + j) % 300 for j in range(40)], [5 + (i + j) % 200 for j in range(20)]
        )
        for i in range(16)
    ]

    async def scoring_is_running():
        while not any(r.startswith("score-") for r in list(llm.requests)):
            await asyncio.sleep(0.002)

    async def tenant_stream(engine):
        request = EngineRequest(
            "tenant",
            prompt_token_ids=[7, 8, 9, 10, 11],
            sampling_params=SamplingParams(
                temperature=0, max_tokens=STREAM_TOKENS, ignore_eos=True
            ),
            fairness_key="tenant-a",
        )
        return [t async for out in engine.generate(request) for t in out.new_token_ids]

    async def main():
        engine = AsyncLLMEngine(llm)
        try:
            if first == "stream":
                stream = asyncio.ensure_future(tenant_stream(engine))
                while not any("tenant" in s["tokens"] for s in steps):
                    await asyncio.sleep(0.002)
                scores = await scoring.score_rows(engine, rows, lora)
                return await stream, scores
            running = asyncio.ensure_future(scoring.score_rows(engine, rows, lora))
            await scoring_is_running()
            tokens = await tenant_stream(engine)
            return tokens, await running
        finally:
            engine.shutdown()

    tokens, scores = asyncio.run(main())
    assert len(tokens) == STREAM_TOKENS and len(scores) == len(rows)
    assert all(s.tokens == 20 and s.adapter_nll is not None for s in scores)
    with_tenant = [s for s in steps if "tenant" in s["held"]]
    assert all("tenant" in s["tokens"] for s in with_tenant), [
        sorted(s["tokens"]) for s in with_tenant
    ]
    assert len(with_tenant) == STREAM_TOKENS  # one token a step, from its first step on
    # ...while the evaluation waited beside it: its requests were in the engine, and none
    # was fed in a step of the tenant's decodes alone (only its prefill's step has room)
    beside = [s for s in with_tenant if any(r.startswith("score-") for r in s["held"])]
    assert len(beside) >= 20
    assert not any(r.startswith("score-") for s in with_tenant[1:] for r in s["finished"])


def test_a_live_stream_keeps_flowing_through_an_evaluation(
    score_server, serve_data, versions
) -> None:
    """The same over HTTP, by the clock: a tenant's stream is running when a large scoring
    request arrives; its tokens keep coming while the engine scores (each step still gives it
    one), and no gap comes near the time the scoring takes."""
    arrivals: list[float] = []
    body = {
        "model": BASE_NAME,
        "messages": CHAT_ROW["messages"],
        "max_tokens": 150,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    headers = {"Authorization": f"Bearer {serve_data['keys'][0]}"}
    usage: list[dict] = []

    def stream():
        url = f"{score_server}/v1/chat/completions"
        with httpx.stream("POST", url, json=body, headers=headers, timeout=120) as response:
            for line in response.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line.removeprefix("data: "))
                if chunk.get("usage"):
                    usage.append(chunk["usage"])
                elif chunk["choices"][0]["delta"].get("content"):  # tokens with text
                    arrivals.append(time.monotonic())

    streaming = threading.Thread(target=stream)
    streaming.start()
    deadline = time.monotonic() + 60
    while len(arrivals) < 10:
        assert time.monotonic() < deadline and streaming.is_alive(), "the stream did not start"
        time.sleep(0.005)
    rows = [
        {"prompt": f"{TEXT_ROW['prompt']} {i}. " * 8, "completion": "x y z " * 8} for i in range(40)
    ]
    started = time.monotonic()
    scored = call(score_server, {"adapter_version": versions["v1"], "rows": rows})
    ended = time.monotonic()
    streaming.join(120)
    assert scored.status_code == 200, scored.text
    assert usage[0]["completion_tokens"] == 150
    during = [t for t in arrivals if started < t < ended]
    assert len(during) >= 3, (len(during), ended - started)  # tokens came while it scored
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:], strict=False) if started < b < ended]
    assert max(gaps) < max(0.5, (ended - started) / 2), gaps
