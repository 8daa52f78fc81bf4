"""Quantized base models: the scheme a checkpoint's config.json declares (`scheme`,
`parse`), and the shapes it can be served at (`shapes`, `tensors`). No torch here: the
registry reads these at import."""

from .parse import parse_quantization
from .scheme import ActivationQuant, QuantizationError, QuantizationScheme, WeightQuant
from .shapes import check_model_shapes, check_module_shapes

__all__ = [
    "ActivationQuant",
    "QuantizationError",
    "QuantizationScheme",
    "WeightQuant",
    "check_model_shapes",
    "check_module_shapes",
    "parse_quantization",
]
