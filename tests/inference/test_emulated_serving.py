"""`serve` on an emulated GPU: the HTTP side, the registry's adapters and the engine's host
side for real, each step the time the cost model gives the emulated model on that GPU. It
says so at start and on /readyz, and counts the device's busy time on /metrics."""

import httpx
import pytest
from openai import OpenAI

from tests.inference.conftest import BASE_NAME, start_server, stop_server

pytestmark = pytest.mark.django_db  # the test database, which the server's rows live in


@pytest.fixture(scope="module")
def emulated(serve_data):
    url, proc, log = start_server(
        serve_data["tmp"],
        {
            "LORAPLEX_EMULATE_DEVICE": "h200",
            "LORAPLEX_EMULATE_MODEL": "llama-3-70b",
            "LORAPLEX_EMULATE_QUANTIZATION": "fp8",
            "LORAPLEX_KV_CACHE_BYTES": str(40 * 2**30),  # of the emulated GPU's memory
        },
        name="serve-emulated",
    )
    yield url, serve_data["keys"][0], log
    stop_server(proc)


def _busy_seconds(url: str) -> float:
    for line in httpx.get(f"{url}/metrics").text.splitlines():
        if line.startswith("loraplex_emulated_device_busy_seconds_total "):
            return float(line.split()[1])
    raise AssertionError("no loraplex_emulated_device_busy_seconds_total on /metrics")


def test_the_server_says_its_device_is_emulated(emulated):
    url, _, log = emulated
    ready = httpx.get(f"{url}/readyz").json()
    assert ready["status"] == "ok"
    assert "emulated: llama-3-70b fp8 on h200" in ready["notes"]["device"]
    assert "THE DEVICE IS EMULATED" in log.read_text()


def test_base_and_adapter_requests_run_on_the_emulated_device(emulated):
    url, key, _ = emulated
    client = OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=60)
    before = _busy_seconds(url)
    for model in (BASE_NAME, "pirate"):
        answer = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Hello"}], max_tokens=5
        )
        assert answer.usage.completion_tokens == 5 and answer.choices[0].message.content
    stream = client.completions.create(model="pirate", prompt="Hi", max_tokens=4, stream=True)
    assert sum(bool(chunk.choices and chunk.choices[0].text) for chunk in stream) >= 1
    # a 70B fp8 step on an H200: milliseconds each (weights over HBM)
    assert _busy_seconds(url) - before > 14 * 0.010
