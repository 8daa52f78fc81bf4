"""A step's inputs: built on the host, packed into one staging buffer, uploaded in one copy.

The inputs builder runs on the `meta` device beside a real CPU engine, so a copy back to
the host would raise and every copy to the device is counted (tests/engine/transfers.py);
the CPU engine's own steps go through the same staging, one upload each."""

import pytest
import torch

from inference.engine import EngineRequest, LLMEngine, SamplingParams
from inference.engine.model_inputs import InputBuilder, step_staging_bytes
from inference.engine.staging import ALIGN, Staging
from tests.engine.transfers import Transfers
from tests.tiny_models import make_tiny_model

META = torch.device("meta")


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("llama"), "llama")


def test_staging_packs_aligned_sections_into_one_upload():
    staging = Staging(256, torch.device("cpu"), pin_memory=False)
    host = [
        torch.arange(3),
        torch.tensor([[1, 2, 3], [4, 5, 6]], dtype=torch.int32),
        torch.empty(0, dtype=torch.long),
        torch.tensor([7], dtype=torch.int32),
    ]
    uploaded = staging.upload(host)
    assert staging.uploads == 1
    base = uploaded[0].data_ptr()
    for got, want in zip(uploaded, host, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.tolist() == want.tolist()
        assert (got.data_ptr() - base) % ALIGN == 0
    buffer = staging.host.data_ptr()
    again = staging.upload([torch.arange(5, 8)])
    assert staging.host.data_ptr() == buffer and staging.uploads == 2
    assert uploaded[0].tolist() == [0, 1, 2] and again[0].tolist() == [5, 6, 7]  # own copies


def test_staging_grows_for_a_step_beyond_its_size():
    staging = Staging(16, torch.device("cpu"), pin_memory=False)
    (uploaded,) = staging.upload([torch.arange(10)])
    assert uploaded.tolist() == list(range(10)) and staging.nbytes >= 80


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_each_step_reaches_the_device_in_one_copy_and_nothing_comes_back(llama_dir, backend):
    engine = LLMEngine(
        model=llama_dir,
        block_size=4,
        kv_cache_bytes=1 << 20,
        attention_backend=backend,
        max_num_seqs=4,
        enforce_eager=True,
    )
    runner = engine.model_runner
    config = runner.config
    meta = InputBuilder(config, META, config.kv_block_bytes, runner.num_blocks)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    for i, n in enumerate((3, 9, 6)):
        engine.add_request(
            EngineRequest(f"r{i}", prompt_token_ids=list(range(5, 5 + n)), sampling_params=params)
        )
    steps = 0
    while (batch := engine.scheduler.schedule()) and steps < 4:
        with Transfers() as transfers:
            on_meta = meta.upload(meta.build(batch).forward)
        assert (transfers.to_device, transfers.to_host) == (1, 0)
        assert on_meta.input_ids.device == META and on_meta.ctx.slot_mapping.device == META
        uploads = runner.input_builder.staging.uploads
        step = runner.compute_logits(batch)
        assert runner.input_builder.staging.uploads == uploads + 1
        engine.scheduler.mark_computed(batch)
        for seq, row in zip(step.samplers, step.logits, strict=True):
            seq.token_ids.append(int(row.argmax()))
        steps += 1
    assert steps == 4 and batch.decodes  # the prefill, then decodes
    assert runner.input_builder.staging.nbytes == step_staging_bytes(config)  # never grew
