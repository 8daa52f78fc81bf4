"""What one tenant can do, within every limit, to slow down the others; and the probe that
measures whether it did.

Each attack keeps its load on the server while `running()` is open. A trial interleaves the
probe (another tenant's short streamed chat: the time to its first token) without the
attack and with it, round after round, so both sides see the same background (the soak's
eight tenants, a worker restarting): the ratio of the two medians is the attack's cost to
others, measured side by side, never against a time tuned for some machine.

- long prompt: completions of nearly `max_model_len` tokens (fresh ids each, so the prefix
  cache never helps), one token each: all prefill;
- echo bomb: a batch of near-context prompts, `n: 16`, `echo` with logprobs, one token each:
  under LORAPLEX_MAX_LOGPROB_ENTRIES and the response-size limit, as large as they allow;
- tokenizations: /tokenize with a body of about 1 MB (the request-size limit is 1 MiB);
- maximal evaluation (tests/faults/evaluation_attack.py): an adapter version with the
  largest eval set its tenant may attach, scored on the engine by the worker; its probe is
  also another tenant's upload, validated meanwhile.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field

import httpx

from tests.clients import chat_stream, http
from tests.waiting import HANG_GUARD_SECONDS, wait_for

# A text whose tokens make the attack prompts: ordinary words, so every id is a real one.
SAMPLE = (
    "The quick brown fox jumps over the lazy dog while seven tailors mend a coat, "
    "and the market opens at nine with apples, pears, bread, cheese and honey."
)
TOKENIZE_BODY_BYTES = 1_000_000  # under the 1 MiB request limit, JSON and all
ECHO_PROMPTS = 4
ECHO_CHOICES = 16  # the most `n` there is (protocol.MAX_CHOICES)


@dataclass(frozen=True)
class Target:
    """Where the attacker sends, and what it builds its prompts from."""

    url: str
    key: str
    model: str
    max_model_len: int
    token_ids: tuple[int, ...]

    def prompt_ids(self, rng: random.Random, length: int) -> list[int]:
        return [rng.choice(self.token_ids) for _ in range(length)]


def target_for(url: str, key: str, model: str) -> Target:
    """The server's context and real token ids for `model`, asked of /tokenize."""
    answer = http(url, "POST", "/tokenize", key=key, json={"model": model, "prompt": SAMPLE})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    return Target(url, key, model, body["max_model_len"], tuple(set(body["tokens"])))


@dataclass(kw_only=True)
class Attack:
    """Load on the server while `running()` is open; `bound`: the most the probe's first
    token may take under it, as a multiple of without it (None: measured, not held to one).
    `statuses` counts the attack's answers (0: none, the connection failed), each one of
    `answers`: the attack stays within the limits, so what they allow is admitted."""

    name: str
    bound: float | None
    rounds: int
    answers: frozenset[int] = frozenset({200})
    statuses: Counter = field(default_factory=Counter)

    def running(self) -> AbstractContextManager[None]:
        raise NotImplementedError

    def trials(self, probe: Callable[[], float]) -> list[Trial]:
        """What the attack costs `probe`, measured side by side (`trial`)."""
        return [trial(self, probe)]


@dataclass(kw_only=True)
class RequestLoop(Attack):
    """`concurrency` threads sending `send(rng)` back to back (or each starting one at most
    every `pace` seconds); the load is in place once one answer is in (the loop past its
    start), and gone once every thread is out of its last request."""

    send: Callable[[random.Random], httpx.Response]
    concurrency: int = 2
    pace: float = 0.0
    runs: int = 0  # each run's threads draw other prompts

    @contextmanager
    def running(self) -> Iterator[None]:
        stop, answered = threading.Event(), threading.Event()
        failures: list[BaseException] = []
        counting = threading.Lock()
        self.runs += 1

        def loop(index: int) -> None:
            rng = random.Random(f"{self.name}-{self.runs}-{index}")
            try:
                while not stop.is_set():
                    began = time.monotonic()
                    try:
                        status = self.send(rng).status_code
                    except httpx.HTTPError:
                        status = 0
                    with counting:
                        self.statuses[status] += 1
                    answered.set()
                    stop.wait(self.pace - (time.monotonic() - began))
            except BaseException as exc:  # surfaced below, not lost in a thread
                failures.append(exc)
                answered.set()

        threads = [
            threading.Thread(target=loop, args=(i,), name=f"attack-{self.name}-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        for thread in threads:
            thread.start()
        try:
            wait_for(answered.is_set, what=f"the {self.name} attack under way")
            yield
        finally:
            stop.set()
            for thread in threads:
                thread.join(HANG_GUARD_SECONDS)
        assert not failures, failures
        assert not any(thread.is_alive() for thread in threads), f"{self.name} hung"


def long_prompt(target: Target) -> Attack:
    """Completions of `max_model_len - 1` fresh tokens and one generated: all prefill."""

    def send(rng: random.Random) -> httpx.Response:
        body = {
            "model": target.model,
            "prompt": target.prompt_ids(rng, target.max_model_len - 1),
            "max_tokens": 1,
        }
        return http(target.url, "POST", "/v1/completions", key=target.key, json=body)

    return RequestLoop(name="long prompt", bound=3.0, rounds=10, send=send, concurrency=2)


def echo_bomb(target: Target) -> Attack:
    """Near-context prompts echoed in every one of 16 choices with their logprobs."""

    def send(rng: random.Random) -> httpx.Response:
        length = target.max_model_len - 1
        body = {
            "model": target.model,
            "prompt": [target.prompt_ids(rng, length) for _ in range(ECHO_PROMPTS)],
            "n": ECHO_CHOICES,
            "echo": True,
            "logprobs": 1,
            "max_tokens": 1,
        }
        return http(target.url, "POST", "/v1/completions", key=target.key, json=body)

    return RequestLoop(name="echo bomb", bound=None, rounds=4, send=send, concurrency=1)


def tokenizations(target: Target) -> Attack:
    """/tokenize with about a megabyte of text, four at a time, each thread starting one a
    second: the load first reported (four such requests of about a second each), whatever the
    server now answers and how fast; a flood of them is the request rate limit's to meet. The
    body is encoded once (a fresh number in front each time): the attacker's own JSON
    encoding would hold this process's GIL, and slow the probe's client rather than the
    server."""
    head = b'{"model": "%s", "prompt": "' % target.model.encode()
    text = b"word " * ((TOKENIZE_BODY_BYTES - len(head) - 40) // len(b"word "))

    def send(rng: random.Random) -> httpx.Response:
        body = b'%s%d %s"}' % (head, rng.getrandbits(64), text)
        headers = {"Content-Type": "application/json"}
        return http(target.url, "POST", "/tokenize", key=target.key, content=body, headers=headers)

    # Answered, or refused as longer than any prompt may be (400): both within the limits.
    answers = frozenset({200, 400})
    return RequestLoop(
        name="tokenizations",
        bound=1.5,
        rounds=10,
        answers=answers,
        send=send,
        concurrency=4,
        pace=1.0,
    )


def tenant_attacks(target: Target) -> list[Attack]:
    return [long_prompt(target), echo_bomb(target), tokenizations(target)]


def first_token_seconds(url: str, key: str, model: str) -> float:
    """A short streamed chat: seconds from sending to its first token (the chunk after the
    opening role chunk)."""
    began = time.perf_counter()
    with chat_stream(url, key, model=model, max_tokens=2) as response:
        assert response.status_code == 200, response.read()
        events = 0
        for line in response.iter_lines():
            if line.startswith("data: "):
                events += 1
                if events == 2:
                    return time.perf_counter() - began
    raise AssertionError("the probe's stream ended before its first token")


@dataclass
class Trial:
    attack: str
    bound: float | None
    idle: list[float]
    attacked: list[float]
    statuses: dict[int, int]
    answers: frozenset[int]
    notes: dict = field(default_factory=dict)  # what else the attack reports of itself

    @property
    def ratio(self) -> float:
        return statistics.median(self.attacked) / statistics.median(self.idle)

    @property
    def held(self) -> bool:
        return self.bound is None or self.ratio <= self.bound

    @property
    def unexpected(self) -> dict[int, int]:
        """Answers the attack should not get (a 5xx, a refusal of what the limits allow)."""
        return {status: n for status, n in self.statuses.items() if status not in self.answers}

    def summary(self) -> dict:
        return {
            "attack": self.attack,
            "bound": self.bound,
            "ratio": round(self.ratio, 2),
            "idle_median_s": round(statistics.median(self.idle), 4),
            "attacked_median_s": round(statistics.median(self.attacked), 4),
            "statuses": self.statuses,
            **self.notes,
        }


def trial(attack: Attack, probe: Callable[[], float]) -> Trial:
    """`attack.rounds` rounds of the probe without the attack, then with it."""
    idle, attacked = [], []
    for _ in range(attack.rounds):
        idle.append(probe())
        with attack.running():
            attacked.append(probe())
    return Trial(attack.name, attack.bound, idle, attacked, dict(attack.statuses), attack.answers)


class Siege(threading.Thread):
    """The attacks one after another (`tenant_attacks`, then `more`), each measured by its
    trials, beside whatever else the server does."""

    def __init__(self, target: Target, probe: Callable[[], float], more: Iterable[Attack] = ()):
        super().__init__(name="siege", daemon=True)
        self.target, self.probe, self.more = target, probe, list(more)
        self.trials: list[Trial] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.probe()  # the first request of a process warms what later ones reuse
            for attack in [*tenant_attacks(self.target), *self.more]:
                self.trials.extend(attack.trials(self.probe))
        except BaseException as exc:  # the test thread raises it
            self.error = exc
