"""quantization_config dicts as llmcompressor 0.14 saves them, for tests that write a
config.json by hand (a scheme the engine refuses cannot come from llmcompressor itself)."""


def quant_args(**kw) -> dict:
    """One QuantizationArgs as compressed-tensors serializes it: every field, nulls too."""
    args: dict = {
        "actorder": None,
        "block_structure": None,
        "dynamic": False,
        "group_size": None,
        "num_bits": 8,
        "observer": "memoryless_minmax",
        "observer_kwargs": {},
        "scale_dtype": None,
        "strategy": "tensor",
        "symmetric": True,
        "type": "int",
        "zp_dtype": None,
    }
    return args | kw


def compressed_config(
    fmt: str, weights: dict, input_activations: dict | None = None, **top
) -> dict:
    """A one-group recipe over every Linear, lm_head left in 16 bits."""
    return {
        "config_groups": {
            "group_0": {
                "format": fmt,
                "input_activations": input_activations,
                "output_activations": None,
                "targets": ["Linear"],
                "weights": weights,
            }
        },
        "format": fmt,
        "global_compression_ratio": None,
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "sparsity_config": {},
        "transform_config": {},
        "version": "0.13.0",
    } | top


TOKEN_FP8 = quant_args(type="float", strategy="token", dynamic=True, observer=None)
FP8_DYNAMIC = compressed_config(
    "float-quantized", quant_args(type="float", strategy="channel"), input_activations=TOKEN_FP8
)


def w4a16(group_size: int, **weights) -> dict:
    return compressed_config(
        "pack-quantized", quant_args(num_bits=4, strategy="group", group_size=group_size, **weights)
    )
