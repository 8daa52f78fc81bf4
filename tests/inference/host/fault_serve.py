"""`manage.py serve` with faults injected, for the live-server tests of what a fault does.

`python -m tests.inference.host.fault_serve --port N` runs the real command in this process
after patching what the environment asks for; `start_fault_server` starts it like
conftest's `start_server`. Test-only: nothing in the product reads these variables.

- LORAPLEX_TEST_STEP_FAULT_FILE: once this file exists, the model runner raises
  (the engine's step thread fails mid-stream).
- LORAPLEX_TEST_STREAM_START_DELAY: seconds between a stream's preparation (its
  concurrency slot taken) and its first byte, as a busy process would take.
"""

import asyncio
import os
import subprocess
import sys
from pathlib import Path


def start_fault_server(tmp: Path, extra_env: dict) -> tuple[str, subprocess.Popen, Path]:
    # imported here: the server process itself needs none of the test fixtures
    from tests.inference.conftest import start_server

    return start_server(
        tmp, extra_env, args=("-m", "tests.inference.host.fault_serve"), name="fault-serve"
    )


def _fail_steps_once(path: str) -> None:
    from inference.engine.model_runner import ModelRunner

    run = ModelRunner.run

    def failing_run(self, batch):
        if os.path.exists(path):
            raise RuntimeError("injected fault in the model runner")
        return run(self, batch)

    ModelRunner.run = failing_run  # type: ignore[method-assign]


def _delay_stream_start(seconds: float) -> None:
    from inference.openai import views

    generate = views._generate

    async def slow_generate(request, endpoint):
        response = await generate(request, endpoint)
        if response.streaming:
            await asyncio.sleep(seconds)
        return response

    views._generate = slow_generate


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "platform_site.settings")
    import django

    django.setup()
    if path := os.environ.get("LORAPLEX_TEST_STEP_FAULT_FILE"):
        _fail_steps_once(path)
    if delay := os.environ.get("LORAPLEX_TEST_STREAM_START_DELAY"):
        _delay_stream_start(float(delay))
    from django.core.management import execute_from_command_line

    execute_from_command_line(["manage.py", "serve", *sys.argv[1:]])


if __name__ == "__main__":
    main()
