"""`manage.py plan`: its JSON, its refusals, and the engine started with its settings
allocating exactly what it planned."""

import json
import re
from io import StringIO

import pytest
from django.conf import settings
from django.core.management import CommandError, call_command

from inference.engine import LLMEngine
from inference.engine.planning import (
    PRESETS,
    SETTING_FIELDS,
    device_named,
    engine_options,
    model_config,
)
from inference.engine.planning.step_time import StepTimeModel
from tests.processes import ROOT
from tests.tiny_llama import make_tiny_llama

EXAMPLE = (
    "--model llama-3-70b --device h200 --quantization fp8 --tp 1 --rank 16 "
    "--targets all-linear --tenants 100 --json"
)
FIELDS = (
    "fits", "reason", "weights_bytes", "weights_bytes_per_gpu", "kv_bytes_per_token",
    "kv_bytes_per_token_per_gpu", "adapter_bytes", "adapter_bytes_per_gpu", "device_slots",
    "host_slots", "kv_tokens", "max_batch", "hit_rates", "swap_in_seconds", "settings",
)  # fmt: skip


def run_plan(*args: str) -> str:
    out = StringIO()
    call_command("plan", *args, stdout=out)
    return out.getvalue()


def test_the_readme_example_prints_one_json_object_that_fits():
    d = json.loads(run_plan(*EXAMPLE.split()))
    assert all(f in d for f in FIELDS)
    assert d["fits"] is True and d["kv_bytes_per_token"] == 327_680
    assert set(d["hit_rates"]) == {"device", "host", "disk"}
    assert d["settings"]["LORAPLEX_MAX_LORAS"] == d["device_slots"] >= 1
    assert d["kv_tokens"] >= d["max_batch"] * d["max_model_len"]


def test_whole_figures_are_every_gpu_together():
    d = json.loads(
        run_plan("--model", "llama-3-70b", "--quantization", "fp8", "--tp", "4", "--json")
    )
    for name in ("weights_bytes", "kv_bytes_per_token", "adapter_bytes", "pool_bytes"):
        assert d[name] == 4 * d[f"{name}_per_gpu"], name
    assert d["settings"]["LORAPLEX_TENSOR_PARALLEL_SIZE"] == 4
    assert d["swap_in_seconds"] == pytest.approx(d["adapter_bytes_per_gpu"] / 55e9)


def test_the_json_carries_the_step_time_models_figures_on_a_gpu_and_none_on_cpu():
    d = json.loads(run_plan(*EXAMPLE.split()))
    steps = StepTimeModel(model_config(PRESETS["llama-3-70b"]), device_named("h200"), "fp8")
    assert d["decode_step_ms"] == steps.decode_step_ms(d["concurrency"], d["max_model_len"])
    assert d["decode_step_ms_batch1"] == steps.decode_step_ms(1, d["max_model_len"])
    assert d["prefill_ms_per_1k_tokens"] == steps.prefill_ms(1024)
    assert d["decode_step_ms_batch1"] < d["decode_step_ms"] < d["prefill_ms_per_1k_tokens"]
    text = run_plan("--model", "llama-3-70b", "--quantization", "fp8")
    assert f"decode {d['decode_step_ms']:,.1f} ms at 64 x 1280 tokens" in text
    cpu = json.loads(
        run_plan(
            "--model", "llama-3-8b", "--device", "cpu", "--memory-bytes", str(64 << 30), "--json"
        )  # fmt: skip
    )
    assert cpu["decode_step_ms"] is None and cpu["prefill_ms_per_1k_tokens"] is None
    assert "step time" not in run_plan("--model", "llama-3-8b", "--device", "cpu",
                                       "--memory-bytes", str(64 << 30))  # fmt: skip


def test_the_table_names_what_fits_and_what_would():
    text = run_plan("--model", "llama-3-70b", "--quantization", "bf16")
    assert "NO:" in text and "would fit" in text and "--tp 2" in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "llama-9"], "unknown model preset 'llama-9'"),
        (["--model", "llama-3-70b", "--tp", "3"], "tensor_parallel_size 3 does not divide"),
        (["--model", "llama-3-8b", "--device", "cpu"], "needs its memory: give --memory-bytes"),
        (["--model", "llama-3-8b", "--targets", "q_proj,lm_head"], "unknown target module lm_head"),
        (["--model", "llama-3-8b", "--tp", "0"], "tp must be a positive integer"),
        (["--config", "/nonexistent/config.json"], "cannot read it"),
        (["--model", "llama-3-8b", "--device", "tpu"], "invalid choice"),
    ],
)
def test_bad_input_is_a_command_error(args, message):
    with pytest.raises(CommandError, match=message):
        run_plan(*args)


@pytest.mark.django_db
def test_from_registry_without_usage_says_so():
    with pytest.raises(CommandError, match="no adapter requests were metered"):
        run_plan("--model", "llama-3-8b", "--from-registry")


def test_every_setting_is_one_serve_reads():
    settings_py = (ROOT / "platform_site" / "settings.py").read_text()
    for name, option in SETTING_FIELDS.items():
        assert option in settings.ENGINE_OPTIONS and re.search(rf'env\.\w+\("{name}"', settings_py)


def test_the_engine_started_with_the_plan_allocates_what_it_planned(tmp_path):
    model = make_tiny_llama(tmp_path / "tiny", num_layers=2, tie=False)
    d = json.loads(
        run_plan(
            "--config",
            str(model / "config.json"),
            "--device",
            "cpu",
            "--memory-bytes",
            str(48 << 20),
            "--rank",
            "8",
            "--tenants",
            "20",
            "--concurrency",
            "6",
            "--prompt-tokens",
            "96",
            "--output-tokens",
            "32",
            "--json",
        )  # fmt: skip
    )
    assert d["fits"], d["reason"]
    engine = LLMEngine(model=model, device="cpu", enable_lora=True, **engine_options(d["settings"]))
    try:
        stats = engine.stats()
        runner = engine.model_runner
        assert stats["kv_blocks_total"] == d["kv_blocks"]
        assert stats["kv_blocks_total"] * runner.block_size == d["kv_tokens"]
        assert stats["lora"]["slots_total"] == d["device_slots"] == 6
        assert stats["weights_bytes"] == d["weights_bytes_per_gpu"]
        pool = runner.pool
        assert pool.num_pages == d["kv_blocks"] and pool.pages_per_slot == d["pages_per_slot"]
        slot_pages = pool.num_slots * pool.pages_per_slot * engine.config.kv_block_bytes
        assert runner.lora_slots.reserved_nbytes + slot_pages == d["slots_bytes_per_gpu"]
        assert runner.lora_slots.row_nbytes == d["adapter_bytes_per_gpu"]
        assert engine.config.max_cpu_loras == d["host_slots"] == 20
        assert engine.config.kv_block_bytes // runner.block_size == d["kv_bytes_per_token"]
    finally:
        engine.close()


SIMULATE = ("--model", "llama-3-8b", "--device", "h100", "--tenants", "4", "--rate", "20",
            "--duration", "2", "--prompt-tokens", "64", "--output-tokens", "16")  # fmt: skip


def test_plan_simulate_runs_the_deployment_on_an_emulated_device(tmp_path, settings):
    settings.VAR_DIR = tmp_path
    served = make_tiny_llama(tmp_path / "served", num_layers=2)
    figures = json.loads(run_plan(*SIMULATE, "--simulate", "--served", str(served), "--json"))
    simulated = figures["simulation"]
    assert simulated["requests"] > 20 and simulated["simulated_seconds"] >= 2
    assert simulated["tokens_per_s"] > 0 and 0 < simulated["device_busy"] <= 1
    assert simulated["ttft_p99_s"] >= simulated["ttft_p50_s"] > 0
    assert set(simulated["hit_rate"]) == {"device", "host", "disk"}
    assert simulated["swap_ins"] >= 4 and simulated["swap_in_seconds"] > 0  # 4 tenants' first
    assert all(s["kv_pages"] + s["adapter_pages"] <= s["pages"] for s in simulated["occupancy"])
    plot = tmp_path / "occupancy.png"
    text = run_plan(*SIMULATE, "--simulate", "--served", str(served), "--plot", str(plot))
    assert "on the emulated device" in text and "device busy" in text and "pool held" in text
    assert plot.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--plot", "occupancy.svg"), "the plot is a PNG"),
        (("--plot", "/nonexistent/occupancy.png"), "no folder /nonexistent"),
    ],
)
def test_plan_plot_refuses_bad_paths_before_simulating(tmp_path, extra, message):
    with pytest.raises(CommandError, match=message):
        run_plan(*SIMULATE, "--simulate", "--served", "/not/read/yet", *extra)


def test_plan_plot_needs_a_simulation(tmp_path):
    with pytest.raises(CommandError, match="add --simulate"):
        run_plan(*SIMULATE, "--plot", str(tmp_path / "occupancy.png"))


@pytest.mark.parametrize(
    "extra, message",
    [
        (("--rate", "0"), "rate and duration must be positive"),
        (("--served", "/nonexistent"), "not a model folder"),
    ],
)
def test_plan_simulate_refuses_bad_flags(tmp_path, extra, message):
    served = ("--served", str(make_tiny_llama(tmp_path / "served", num_layers=2)))
    with pytest.raises(CommandError, match=message):
        run_plan(*SIMULATE, "--simulate", *served, *extra)


def test_plan_simulate_needs_a_gpu(tmp_path):
    with pytest.raises(CommandError, match="emulates a GPU"):
        run_plan("--model", "llama-3-8b", "--device", "cpu", "--memory-bytes", str(64 << 30),
                 "--simulate")  # fmt: skip
