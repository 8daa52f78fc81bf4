"""The largest evaluation one tenant can ask for, and what it costs another tenant.

The attacker uploads an adapter version with the largest eval set the deployment's limits
let it attach (registry/eval_sets.py: LORAPLEX_EVAL_MAX_ROWS rows, LORAPLEX_EVAL_MAX_TOKENS
tokens counted as the UTF-8 bytes of the rows' texts, LORAPLEX_EVAL_MAX_BYTES, 16 KiB per
row), each row as long as the engine scores (one context): the worker then scores it on the
engine, under the adapter and the base model alone, at background priority. Evaluations run
in a worker of their own (queue `evaluation`), so the promise to hold is that meanwhile
another tenant's upload is validated in its usual time; its chats' first token is reported.

A round measures the other tenant's upload-to-ready time and its chat's time to a first
token without the evaluation, then with it, so both sides see the same background.
"""

from __future__ import annotations

import random
import string
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from tests.clients import http, metric
from tests.faults.attacks import Attack, Target, Trial
from tests.trained_adapter import eval_set_jsonl
from tests.waiting import wait_for

# Characters whose bytes the tiny tokenizer's merges (trained on words) rarely join: close to
# one token per byte, the most scoring the byte count allows. No quote or backslash: each
# JSONL byte is one of the text's.
ALPHABET = "".join(
    c for c in string.ascii_letters + string.digits + string.punctuation if c not in '"\\'
)
COMPLETION_CHARS = 32  # what is scored under each prompt: a few dozen tokens
CONTEXT_MARGIN = 4  # a beginning-of-sequence token, and the one scored after the completion
ROW_CHARS = 16 * 1024  # registry/eval_sets.py MAX_ROW_CHARS
PENDING = ("pending", "validating")
FINISHED = ("passed", "degraded", "failed")
VERSION_FILES = ("adapter_config.json", "adapter_model.safetensors")


@dataclass(frozen=True)
class EvalLimits:
    """What one tenant may attach (settings.EVAL_MAX_*), read where the server reads them."""

    rows: int
    tokens: int
    bytes: int

    @classmethod
    def of_settings(cls) -> EvalLimits:
        from django.conf import settings

        return cls(settings.EVAL_MAX_ROWS, settings.EVAL_MAX_TOKENS, settings.EVAL_MAX_BYTES)


@dataclass(frozen=True)
class EvalSet:
    data: bytes
    rows: int
    token_bound: int  # as the registry counts it: the UTF-8 bytes of the rows' texts
    row_tokens: int  # the engine's tokens for one full row (prompt and completion)


def maximal_eval_set(target: Target, limits: EvalLimits) -> EvalSet:
    """As many rows as the limits allow, each one context long (prompt and completion within
    `max_model_len - 1` tokens, or the engine refuses the row and the evaluation fails at
    once: no work), until the rows, the tokens or the bytes run out."""
    rng = random.Random("maximal-eval-set")
    per_row = min(target.max_model_len - 1 - CONTEXT_MARGIN, ROW_CHARS)
    rows: list[dict] = []
    size = tokens = 0
    while len(rows) < limits.rows:
        length = min(per_row, limits.tokens - tokens)
        if length <= COMPLETION_CHARS:
            break
        text = "".join(rng.choices(ALPHABET, k=length))
        row = {"prompt": text[COMPLETION_CHARS:], "completion": text[:COMPLETION_CHARS]}
        line = len(eval_set_jsonl([row]))
        if size + line > limits.bytes:
            break
        rows.append(row)
        size, tokens = size + line, tokens + length
    row_tokens = _tokens(target, rows[0]["prompt"]) + _tokens(target, rows[0]["completion"])
    assert row_tokens <= target.max_model_len - 1, (row_tokens, target.max_model_len)
    return EvalSet(eval_set_jsonl(rows), len(rows), tokens, row_tokens)


def _tokens(target: Target, text: str) -> int:
    body = {"model": target.model, "prompt": text}
    answer = http(target.url, "POST", "/tokenize", key=target.key, json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()["count"]


@dataclass(kw_only=True)
class MaximalEvaluation(Attack):
    """The attacker's maximal evaluation while `running()` is open: a fresh adapter each
    time, its version uploaded with the eval set; open once the worker scores it on the
    engine, and closed by deleting the adapter with force: the evaluation is revoked, and
    the worker sends none of its rows after the request in flight (at most SCORE_CHUNK_ROWS
    rows, which the engine finishes; the next round's first probe may see their end, which
    can only make "without" slower). `probe_key`'s tenant is the one whose uploads are timed."""

    target: Target
    probe_key: str
    adapter_folder: Path
    eval_set: EvalSet
    overlapped: int = 0  # rounds whose evaluation still scored when the probes were done
    runs: int = 0
    probe_uploads: int = 0

    def _files(self, eval_set: bytes | None) -> dict:
        files = {
            part: (name, (self.adapter_folder / name).read_bytes())
            for part, name in zip(("config", "weights"), VERSION_FILES, strict=True)
        }
        return files if eval_set is None else files | {"eval": ("eval.jsonl", eval_set)}

    def _send(self, key: str, method: str, path: str, **kwargs) -> dict:
        response = http(self.target.url, method, path, key=key, **kwargs)
        if key == self.target.key:
            self.statuses[response.status_code] += 1
        assert response.status_code in self.answers, (path, response.status_code, response.text)
        return response.json() if response.content else {}

    def _upload(self, key: str, adapter: str, eval_set: bytes | None) -> str:
        """A fresh adapter and its first version; the version's API path."""
        body = {"name": adapter, "base_model": self.target.model}
        self._send(key, "POST", "/api/v1/adapters/", json=body)
        files = self._files(eval_set)
        version = self._send(key, "POST", f"/api/v1/adapters/{adapter}/versions/", files=files)
        return f"/api/v1/adapters/{adapter}/versions/{version['number']}/"

    def _evaluation(self, path: str) -> str:
        """The status of the newest evaluation of the attacker's version ("none" before)."""
        version = self._send(self.target.key, "GET", path)
        assert version["status"] in (*PENDING, "ready"), version
        return (version["evaluation"] or {"status": "none"})["status"]

    def _scoring(self, path: str) -> bool:
        """Running: the worker took it (its tenant's turn) and sends rows to the engine, which
        holds work (the others' chats are short: it is seen between two of its rows too). A
        verdict this early fails: the set was not scored for long."""
        status = self._evaluation(path)
        assert status not in FINISHED, f"the maximal evaluation ended {status} at once"
        names = ("loraplex_requests_running", "loraplex_requests_waiting")
        busy = sum(metric(self.target.url, name) for name in names) > 0
        return status == "running" and busy

    @contextmanager
    def running(self) -> Iterator[None]:
        self.runs += 1
        adapter = f"maximal-eval-{self.runs}"
        try:
            path = self._upload(self.target.key, adapter, self.eval_set.data)
            wait_for(lambda: self._scoring(path), what="the maximal evaluation on the engine")
            yield
            self.overlapped += self._evaluation(path) == "running"
        finally:  # revoked: the worker sends no more of its rows
            self._send(self.target.key, "DELETE", f"/api/v1/adapters/{adapter}/?force=true")

    def upload_seconds(self) -> float:
        """The probe tenant's upload (a fresh adapter's first version, no eval set): seconds
        from sending it to seeing it validated, ready."""
        self.probe_uploads += 1
        adapter = f"probe-upload-{self.probe_uploads}"
        began = time.perf_counter()
        path = self._upload(self.probe_key, adapter, None)

        def validated() -> dict | None:
            version = self._send(self.probe_key, "GET", path)
            return None if version["status"] in PENDING else version

        version = wait_for(validated, what=f"{adapter} validated", interval=0.05)
        seconds = time.perf_counter() - began
        assert version is not None and version["status"] == "ready", version
        return seconds

    def trials(self, probe: Callable[[], float]) -> list[Trial]:
        """Per round, the probe tenant's upload and first token without the evaluation, then
        with it: the upload held to `bound`, the first token reported."""
        uploads: tuple[list[float], list[float]] = ([], [])
        tokens: tuple[list[float], list[float]] = ([], [])
        for _ in range(self.rounds):
            uploads[0].append(self.upload_seconds())
            tokens[0].append(probe())
            with self.running():
                uploads[1].append(self.upload_seconds())
                tokens[1].append(probe())
        notes = {
            "eval_rows": self.eval_set.rows,
            "eval_token_bound": self.eval_set.token_bound,
            "row_tokens": self.eval_set.row_tokens,
            "overlapped_rounds": self.overlapped,
        }
        statuses, answers = dict(self.statuses), self.answers
        return [
            Trial(f"{self.name}: upload validated", self.bound, *uploads, statuses, answers, notes),
            Trial(f"{self.name}: first token", None, *tokens, statuses, answers, notes),
        ]


def maximal_evaluation(
    target: Target, *, probe_key: str, adapter_folder: Path, limits: EvalLimits
) -> MaximalEvaluation:
    return MaximalEvaluation(
        name="maximal evaluation",
        # Another tenant's validation on a shared 2-core machine: its usual time, within a
        # generous margin (the evaluation's HTTP waits and the engine's background rows
        # share the cores with the validating worker).
        bound=3.0,
        rounds=5,
        answers=frozenset({200, 201, 202, 204}),
        target=target,
        probe_key=probe_key,
        adapter_folder=adapter_folder,
        eval_set=maximal_eval_set(target, limits),
    )
