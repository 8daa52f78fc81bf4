"""Multi-LoRA kernels: segmented shrink/expand over a batch of tokens using many adapters;
and the GEMMs of quantized base weights (packed 4/8-bit integers, FP8) under them.

Triton on CUDA, a torch reference on CPU, one signature. Nothing here imports Django, and the
Triton module is imported only when the Triton backend runs.
"""

from inference.kernels.backend import select_backend
from inference.kernels.lora_batch import LoRABatch, make_lora_batch
from inference.kernels.lora_ops import add_lora, lora_expand, lora_shrink
from inference.kernels.quant_ops import Fp8Weights, PackedIntWeights, quant_linear

__all__ = [
    "Fp8Weights",
    "LoRABatch",
    "PackedIntWeights",
    "add_lora",
    "lora_expand",
    "lora_shrink",
    "make_lora_batch",
    "quant_linear",
    "select_backend",
]
