"""Every Celery queue (platform_site/celery.py) is consumed wherever Loraplex runs: by exactly
one worker in compose, in Kubernetes and in `make run`. Evaluations have a worker of their own,
so that an upload's validation never waits behind an eval set's scoring, and beat runs in
exactly one worker."""

from __future__ import annotations

import re
import shlex

import yaml

from platform_site.celery import EVALUATION_QUEUE, QUEUES, STAGING_QUEUE, VALIDATION_QUEUE, app
from registry import queue

from .tools import DEPLOY, ROOT

CELERY_WORKER = ["celery", "-A", "platform_site", "worker"]


def queues_of(command: list[str]) -> set[str]:
    assert command[:4] == CELERY_WORKER, command
    assert "-Q" in command, f"a worker without -Q consumes every queue, evaluations too: {command}"
    return set(command[command.index("-Q") + 1].split(","))


def check_workers(workers: dict[str, list[str]]) -> str:
    """Each queue consumed once, evaluations alone, beat in one worker: that worker's name."""
    consumed = sorted(q for command in workers.values() for q in queues_of(command))
    assert consumed == sorted(QUEUES), workers
    (evaluator,) = [n for n, c in workers.items() if EVALUATION_QUEUE in queues_of(c)]
    assert queues_of(workers[evaluator]) == {EVALUATION_QUEUE}
    (beat,) = [name for name, command in workers.items() if "-B" in command]
    assert beat != evaluator
    return beat


def test_the_registry_tasks_go_to_their_own_queues():
    routed = {
        name: app.amqp.router.route({}, name)["queue"].name
        for name in (queue.VALIDATE, queue.STAGE, queue.EVALUATE, queue.SWEEP, queue.RECHECK)
    }
    assert routed == {
        queue.VALIDATE: VALIDATION_QUEUE,
        queue.STAGE: STAGING_QUEUE,
        queue.EVALUATE: EVALUATION_QUEUE,
        queue.SWEEP: "celery",
        queue.RECHECK: "celery",
    }
    # a worker started without -Q (the tests' own, a one-process deployment) takes them all
    assert {q.name for q in app.conf.task_queues} == set(QUEUES)


def test_compose_runs_a_worker_per_queue():
    services = yaml.safe_load((ROOT / "docker" / "compose.yaml").read_text())["services"]
    workers = {
        name: service["command"]
        for name, service in services.items()
        if service.get("command", [])[:4] == CELERY_WORKER
    }
    assert check_workers(workers) == "worker"
    assert "deploy" not in services["worker"]  # one beat: never replicated


def test_kubernetes_runs_a_worker_per_queue():
    docs = yaml.safe_load_all((DEPLOY / "kubernetes" / "worker.yaml").read_text())
    deployments = {doc["metadata"]["name"]: doc for doc in docs if doc}
    workers = {}
    for name, doc in deployments.items():
        (container,) = doc["spec"]["template"]["spec"]["containers"]
        workers[name] = container["command"]
        probe = container["livenessProbe"]["exec"]["command"][-1]
        assert "inspect ping -d celery@$HOSTNAME" in probe
    beat = deployments[check_workers(workers)]["spec"]
    assert beat["replicas"] == 1 and beat["strategy"]["type"] == "Recreate"


def make_run_workers() -> dict[str, list[str]]:
    """The `celery worker` commands scripts/run-embedded.sh starts, by node name."""
    text = (ROOT / "scripts" / "run-embedded.sh").read_text().replace("\\\n", " ")
    found = re.findall(r'"\$VENV/bin/celery" (-A platform_site worker .+?) &$', text, re.M)
    workers = {}
    for line in found:
        command = ["celery", *shlex.split(line)]
        workers[command[command.index("-n") + 1]] = command
    return workers


def test_make_run_runs_evaluations_in_a_worker_of_their_own():
    workers = make_run_workers()
    assert len(workers) == 2, workers  # light on a small machine: two processes
    check_workers(workers)
    (evaluator,) = [c for c in workers.values() if queues_of(c) == {EVALUATION_QUEUE}]
    # threads: each evaluation mostly waits on the engine; two tenants measured at once
    assert evaluator[evaluator.index("-P") + 1] == "threads"
    assert int(evaluator[evaluator.index("--concurrency") + 1]) >= 2
