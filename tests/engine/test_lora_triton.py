"""The engine's LoRA layers on the Triton kernels (run by the Triton interpreter on CPU): the
same logits as on the torch backend, through the engine's own slot stacks (strided views of
one buffer), at prefill and decode. On a GPU the same path runs compiled.

It runs in a child process: TRITON_INTERPRET must be set before Triton's modules load, which
in this process may already have happened without it."""

import importlib.util
import os

import pytest

from tests.engine.lora_fixtures import ALL_LINEAR
from tests.fresh_python import run_python

SCRIPT = r"""
import sys

import torch

from inference.engine import EngineRequest, LoRARequest, SamplingParams
from tests.engine.lora_fixtures import lora_engine
from tests.engine.stepping import step_logits

model, *paths = sys.argv[1:]
loras = [LoRARequest(f"t{i}", f"t{i}", p) for i, p in enumerate(paths)] + [None]


def two_steps(engine):
    futures = [engine.load_lora(lora) for lora in loras if lora is not None]
    while not all(f.done() for f in futures):
        engine.step()  # takes the finished loads in
        engine.wait_for_load(0.05)
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    for i, lora in enumerate(loras):
        engine.add_request(EngineRequest(f"r{i}", prompt_token_ids=[5 + i, 9, 17, 33][: 2 + i],
                           sampling_params=params, lora_request=lora))
    logits = []
    for _ in range(2):
        rows = step_logits(engine)
        assert len(rows) == len(loras)
        logits.append(torch.stack([row for _, row in rows]))
        for seq, row in rows:
            seq.token_ids.append(int(row.argmax()))
    return logits


torch_engine = lora_engine(model, max_loras=2)
assert torch_engine.model_runner.lora_slots.backend == "torch"
expected = two_steps(torch_engine)
import os

os.environ["LORAPLEX_LORA_BACKEND"] = "triton"
triton_engine = lora_engine(model, max_loras=2)
assert triton_engine.model_runner.lora_slots.backend == "triton"
for got, want in zip(two_steps(triton_engine), expected, strict=True):
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
print("same logits")
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed")
def test_triton_kernels_in_the_engine_match_the_torch_backend(lora_model_dir, adapters):
    paths = [
        adapters("t0", rank=8, targets=ALL_LINEAR),
        adapters("t1", rank=4, targets=("q_proj", "v_proj")),
    ]
    env = {k: v for k, v in os.environ.items() if k != "LORAPLEX_LORA_BACKEND"}
    result = run_python(
        SCRIPT, str(lora_model_dir), *map(str, paths), env=env | {"TRITON_INTERPRET": "1"}
    )
    assert result.returncode == 0 and "same logits" in result.stdout, result.stderr[-3000:]
