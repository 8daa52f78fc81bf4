"""The float64 twin that judges FP8 rounding ties computes the scheme transformers runs:
every FP8 checkpoint's logits (with and without an adapter) follow from it within the
parity tolerance, so a tie it accepts is one of the scheme's two roundings."""

from __future__ import annotations

import warnings

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from tests.quantized.fp8_ties import Fp8Twin

ATOL = 1e-4
FP8 = ["llama-fp8-dynamic", "llama-fp8-static", "qwen2-fp8-dynamic"]


def _transformers(folder):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


@pytest.mark.parametrize("with_adapter", [False, True], ids=["base", "lora"])
@pytest.mark.parametrize("name", FP8)
def test_the_twin_follows_transformers(
    compressed_checkpoints, packed_checkpoints, name, with_adapter
):
    family = name.split("-", 1)[0]
    adapter = packed_checkpoints.adapters[family] if with_adapter else None
    reference = _transformers(compressed_checkpoints.folders[name])
    if adapter is not None:
        reference = PeftModel.from_pretrained(reference, str(adapter)).eval()
    twin = Fp8Twin(
        compressed_checkpoints.folders[name], compressed_checkpoints.bases[family], adapter
    )
    generator = torch.Generator().manual_seed(3)
    for n in (4, 9):
        ids = torch.randint(3, 384, (n,), generator=generator).tolist()
        with torch.no_grad():
            row = reference(torch.tensor([ids])).logits[0, -1]
        assert twin.explain(ids, row, ATOL) is not None, (name, ids)
        for tie in twin.ties(ids):
            assert tie.below < tie.exact < tie.above, tie
