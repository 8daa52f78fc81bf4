"""A deployment's traffic through the engine on the emulated device, on a virtual clock."""

import time

import pytest

from inference.engine import LLMEngine
from inference.engine.emulation.adapters import tenant_adapters
from inference.engine.simulation import Traffic, simulate
from tests.tiny_llama import make_tiny_llama

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@pytest.fixture(scope="module")
def served_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("simulated"), num_layers=2)


def _engine(served_dir) -> LLMEngine:
    return LLMEngine(model=served_dir, emulate_device="h100", emulate_model="llama-3-8b",
                     max_model_len=256, enable_lora=True, max_loras=2, max_cpu_loras=3)  # fmt: skip


def test_a_simulated_trace_runs_faster_than_its_clock(served_dir, tmp_path):
    traffic = Traffic(rate=40, duration=3, tenants=6, prompt_tokens=64, output_tokens=24)
    adapters = tenant_adapters(served_dir, tmp_path, 6, 8, TARGETS)
    engine = _engine(served_dir)
    start = time.perf_counter()
    result = simulate(engine, traffic, adapters)
    wall = time.perf_counter() - start
    assert result.requests == len(traffic.arrivals(engine.config.model_config.vocab_size, 256))
    assert result.requests > 60
    assert result.simulated_seconds >= 3  # the last arrival near 3 s, then its answer
    assert 0 < result.device_busy <= 1
    assert result.ttft_p50_s > 0 and result.itl_p50_ms > 0
    assert result.swap_ins >= 6  # six tenants through two device slots
    assert sum(result.hit_rate.values()) == pytest.approx(1, abs=1e-3)
    assert result.occupancy and max(o["adapter_pages"] for o in result.occupancy) > 0
    # the device's time was counted, not waited for
    assert wall < result.simulated_seconds + engine.model_runner.device.busy_seconds


def test_the_same_trace_gives_the_same_requests(served_dir):
    traffic = Traffic(rate=10, duration=5, tenants=4, seed=3)
    assert traffic.arrivals(1000, 512) == traffic.arrivals(1000, 512)
    assert all(len(p) + n <= 512 for _, _, p, n in traffic.arrivals(1000, 512))


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"rate": 0, "duration": 1}, "rate and duration must be positive"),
        ({"rate": 1, "duration": -1}, "rate and duration must be positive"),
        ({"rate": 1, "duration": 1, "tenants": 0}, "tenants must be at least 1"),
        ({"rate": 1, "duration": 1, "tenants": 2, "usage_counts": (1,)}, "one count per tenant"),
    ],
)
def test_bad_traffic_says_what_is_wrong(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Traffic(**kwargs)
