"""A response's bytes are estimated before generation (inference/openai/response_size.py),
and the tenant's token budget is charged for every choice.

Before, `{"prompt": [[46778] * 8191] * 16, "n": 16, "echo": true, "max_tokens": 0}` (786 KB)
answered 172 MB after 113 s (256 choices, each echoing 8,191 copies of an 81-character
token), and the budget was charged each prompt once, not once per choice. Here the same
shape on the tiny model (512-token context, its " capital" token, 8 characters), against a
server whose limit is 256 KiB, and a token budget kept in a Redis of this module's own so the
test reads the counters the server writes.
"""

import re
import time

import httpx
import pytest
from django.core.cache.backends.redis import RedisCache

from inference.engine.tokenizer import Tokenizer
from inference.openai.echo import echoed_prompts
from inference.openai.protocol import parse_chat_request, parse_completion_request
from inference.openai.response_size import estimate
from tests.clients import http, refusal, sse_events
from tests.faults.services import RedisServer
from tests.inference.conftest import BASE_NAME, LiveServer, start_server, stop_server
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db  # the server reads rows committed by serve_data
LIMIT = 256 * 1024
TPM = 100_000
CAPITAL = 306  # the tiny vocabulary's " capital"
BOMB = {"prompt": [[CAPITAL] * 511] * 16, "n": 16, "echo": True, "max_tokens": 0}
PROMPT = list(range(10, 30))  # token ids: exactly 20 prompt tokens


@pytest.fixture(scope="module")
def redis(tmp_path_factory):
    server = RedisServer(tmp_path_factory.mktemp("redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def server(serve_data, redis):
    url, proc, log = start_server(
        serve_data["tmp"],
        {
            "LORAPLEX_MAX_RESPONSE_BYTES": str(LIMIT),
            "LORAPLEX_MAX_REQUEST_BYTES": str(1024 * 1024),  # a batch of 64 long prompts
            "REDIS_URL": redis.url,
            "LORAPLEX_RATE_LIMIT_RPM": "0",
            "LORAPLEX_RATE_LIMIT_TPM": str(TPM),
        },
    )
    key_a, key_b, key_a_ro = serve_data["keys"]
    yield LiveServer(
        url, key_a, key_b, key_a_ro, serve_data["adapter_dir"], serve_data["base_dir"], proc, log
    )
    stop_server(proc)


@pytest.fixture(scope="module")
def tokenizer(serve_data) -> Tokenizer:
    return Tokenizer.from_folder(serve_data["base_dir"])


def complete(server, **body) -> httpx.Response:
    payload = {"model": BASE_NAME, "temperature": 0, **body}
    return http(server, "POST", "/v1/completions", key=server.key_a, json=payload)


# ---------------------------------------------------------------- the size limit


@pytest.mark.parametrize("stream", [False, True])
def test_the_echo_bomb_is_refused_naming_n_before_generation_and_charges_nothing(
    server, redis, stream
):
    """256 choices of 511 x 8 echoed characters: about 1 MB; one choice per prompt fits."""
    budget = TokenBudget(redis)
    error = refusal(server, "completions", {"model": BASE_NAME, **BOMB, "stream": stream})
    assert error["param"] == "n" and error["code"] == "invalid_request"
    message = error["message"]
    assert "LORAPLEX_MAX_RESPONSE_BYTES" in message and f"{LIMIT:,}" in message
    estimated = re.search(r"would hold up to ([\d,]+) bytes", message)
    assert estimated and int(estimated.group(1).replace(",", "")) > LIMIT
    # the echoed text exactly: 256 choices x 511 x " capital"
    assert "echo 1,046,528" in message and "16 prompts x 16 choices" in message
    assert budget.charged() == 0


def test_the_bomb_estimate_is_the_echoed_text_it_would_send(server, tokenizer):
    """Echoed text is known exactly: the estimate of a bomb small enough to answer is its
    answer's size, give or take the choices' fixed parts."""
    body = {**BOMB, "prompt": [[CAPITAL] * 511] * 4, "n": 8}  # 32 choices: 130 KB
    response = complete(server, **body)
    assert response.status_code == 200, response.text[:300]
    assert response.json()["choices"][0]["text"] == " capital" * 511
    real = len(response.content)
    estimated = estimate_of(tokenizer, body).total
    assert real <= estimated <= real + 32 * 200 + 400


def test_a_batch_too_large_even_with_one_choice_names_the_prompt(server):
    """64 prompts of 511 x 8 echoed characters, one choice each: past the limit, though any
    one of them is far within it."""
    batch = {"model": BASE_NAME, **BOMB, "prompt": [[CAPITAL] * 511] * 64, "n": 1}
    error = refusal(server, "completions", batch)
    assert error["param"] == "prompt" and "fewer prompts per request" in error["message"]


def test_generated_logprobs_count_every_token_at_the_longest_and_name_logprobs(server):
    """480 tokens, each with 20 alternatives, any of which may be the vocabulary's longest."""
    body = {"model": BASE_NAME, "prompt": PROMPT, "max_tokens": 480, "logprobs": 20}
    error = refusal(server, "completions", body)
    assert error["param"] == "logprobs"
    assert complete(server, prompt=PROMPT, max_tokens=100, logprobs=20).status_code == 200


def test_chat_top_logprobs_name_top_logprobs(server):
    body = {
        "model": BASE_NAME,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 200,
        "logprobs": True,
        "top_logprobs": 20,
    }
    error = refusal(server, "chat/completions", body)
    assert error["param"] == "top_logprobs"
    assert "LORAPLEX_MAX_RESPONSE_BYTES" in error["message"]


def test_best_of_candidates_count_and_are_named(server):
    """Every candidate is generated and held until the best is picked."""
    body = {"model": BASE_NAME, "prompt": PROMPT, "max_tokens": 400, "logprobs": 5}
    assert complete(server, **{**body, "best_of": 1}).status_code == 200
    error = refusal(server, "completions", {**body, "best_of": 4})
    assert error["param"] == "best_of"


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_evaluation_harness_scoring_fits(server, max_tokens):
    """lm-eval's loglikelihood requests: a batch of texts, echo, logprobs 1, max_tokens 0/1."""
    text = "the capital of France is Paris, and of Germany Berlin. " * 4
    texts = [f"Question {i}: {text}" for i in range(16)]
    response = complete(server, prompt=texts, echo=True, logprobs=1, max_tokens=max_tokens)
    assert response.status_code == 200, response.text[:300]
    choices = response.json()["choices"]
    assert [c["text"][: len(texts[i])] for i, c in enumerate(choices)] == texts
    assert all(c["logprobs"]["token_logprobs"][0] is None for c in choices)


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": [[CAPITAL] * 100] * 4, "n": 4, "echo": True, "max_tokens": 0},
        {"prompt": [PROMPT] * 3, "echo": True, "logprobs": 1, "max_tokens": 1},
        {"prompt": PROMPT, "n": 2, "logprobs": 5, "max_tokens": 50, "ignore_eos": True},
        {"prompt": PROMPT, "n": 2, "prompt_logprobs": 3, "max_tokens": 10},
        {"prompt": "Héllo wörld 🙂 ∞", "echo": True, "best_of": 3, "logprobs": 2, "max_tokens": 9},
    ],
)
def test_the_estimate_is_never_below_the_answer(server, tokenizer, body):
    response = complete(server, **body)
    assert response.status_code == 200, response.text[:300]
    assert len(response.content) <= estimate_of(tokenizer, body).total


def test_a_chat_estimate_is_never_below_the_answer(server, tokenizer):
    body = {
        "model": BASE_NAME,
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 40,
        "n": 2,
        "logprobs": True,
        "top_logprobs": 5,
        "ignore_eos": True,
    }
    response = http(server, "POST", "/v1/chat/completions", key=server.key_a, json=body)
    assert response.status_code == 200, response.text[:300]
    parsed = parse_chat_request(body)
    prompt = tokenizer.encode(tokenizer.apply_chat_template(parsed.messages))
    size = estimate(parsed, "chat", tokenizer, [prompt], [40], None)
    assert len(response.content) <= size.total


# ---------------------------------------------------------------- the token budget


@pytest.mark.parametrize("stream", [False, True])
def test_every_choice_is_charged_its_prompt_and_its_tokens(server, redis, stream):
    """n=4 of a 20-token prompt, 5 tokens each: 4 x (20 + 5) = 100 tokens, where the prompt
    used to count once (40); `usage` still counts it once, as OpenAI's does."""
    budget = TokenBudget(redis)
    body = {"prompt": PROMPT, "n": 4, "max_tokens": 5, "ignore_eos": True, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    response = complete(server, **body)
    assert response.status_code == 200, response.text[:300]
    usage = sse_events(response)[-1]["usage"] if stream else response.json()["usage"]
    assert usage == {"prompt_tokens": 20, "completion_tokens": 20, "total_tokens": 40}
    budget.becomes(4 * (20 + 5))


def test_best_of_is_charged_every_candidate(server, redis):
    budget = TokenBudget(redis)
    body = {"prompt": PROMPT, "best_of": 3, "max_tokens": 5, "ignore_eos": True}
    response = complete(server, **body)
    assert response.status_code == 200, response.text[:300]
    assert len(response.json()["choices"]) == 1
    budget.becomes(3 * (20 + 5))


def test_an_echo_of_many_choices_is_charged_each_prompt_in_every_choice(server, redis):
    """max_tokens 0: the engine's one sampled token per choice is reserved, then given back."""
    budget = TokenBudget(redis)
    body = {"prompt": [PROMPT] * 2, "n": 3, "echo": True, "logprobs": 1, "max_tokens": 0}
    assert complete(server, **body).status_code == 200
    budget.becomes(2 * 3 * 20)


def test_choices_past_the_budget_are_refused_at_admission(server, redis):
    """16 prompts of 400 tokens, 16 choices each, may use 256 x 401 tokens: more than the
    100,000 a minute; counted once per prompt, they passed (6,656)."""
    budget = TokenBudget(redis)
    prompt = [t % 380 + 3 for t in range(400)]
    response = complete(server, prompt=[prompt] * 16, n=16, max_tokens=1)
    assert response.status_code == 429, response.text[:300]
    error = response.json()["error"]
    assert error["code"] == "tokens_exceeded" and "102656 tokens" in error["message"]
    assert budget.charged() == 0


# ---------------------------------------------------------------- helpers


def estimate_of(tokenizer: Tokenizer, body: dict):
    """What the server estimates for the completion `body` (its prompts in token ids or text)."""
    parsed = parse_completion_request({"model": BASE_NAME, **body})
    assert parsed.prompts is not None
    ids = [p if isinstance(p, list) else tokenizer.encode(p) for p in parsed.prompts]
    echoes = echoed_prompts(tokenizer, parsed.prompts, ids) if parsed.echo else None
    budget = parsed.max_tokens if parsed.max_tokens is not None else 16
    return estimate(parsed, "text", tokenizer, ids, [budget] * len(ids), echoes)


class TokenBudget:
    """Tenant A's token counters in the server's cache, one per minute, summed over the
    minutes since this was made (a request counts in the minute it was admitted in)."""

    def __init__(self, redis: RedisServer):
        from tenants.models import Tenant

        if 60 - time.time() % 60 < 10:  # a settlement after the minute turned is dropped
            this = time.time() // 60
            wait_for(lambda: time.time() // 60 > this, what="the next minute", timeout=20)
        self.cache = RedisCache(redis.url, {})
        self.tenant_id = Tenant.objects.get(slug="serve-a").id
        self.first = int(time.time() // 60) * 60
        self.before = self._total()

    def _total(self) -> int:
        minutes = range(self.first, int(time.time() // 60) * 60 + 60, 60)
        return sum(int(self.cache.get(f"rl:tok:{self.tenant_id}:{m}", 0)) for m in minutes)

    def charged(self) -> int:
        return self._total() - self.before

    def becomes(self, tokens: int) -> None:
        """Wait for the charge to be `tokens` (what a request did not use goes back after
        its answer)."""
        wait_for(lambda: self.charged() == tokens, what=f"{tokens} tokens charged")
