"""Property: whatever bytes arrive, the registry's validator answers with a result.

Random bytes, mutated headers and random configs go through `validate_adapter_files` (and
so through the engine's header parser and PEFT rules); it must never raise, every check
must carry a message, and anything it passes must really open with `safetensors`.
"""

import json
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors import safe_open

from inference.engine.lora.peft_rules import fingerprint_from_config
from registry.validation import ValidationResult, validate_adapter_files
from tests.registry import safetensors_edit as edit

FAST = settings(
    max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)


@pytest.fixture(scope="module")
def good(good_adapter_dir, tiny_base_dir):
    config = (good_adapter_dir / "adapter_config.json").read_bytes()
    weights = (good_adapter_dir / "adapter_model.safetensors").read_bytes()
    fingerprint = fingerprint_from_config(json.loads((tiny_base_dir / "config.json").read_text()))
    return config, weights, fingerprint


def validate(config: bytes, weights: bytes, fingerprint) -> ValidationResult:
    with tempfile.TemporaryDirectory() as tmp:
        c, w = Path(tmp) / "c.json", Path(tmp) / "w.safetensors"
        c.write_bytes(config)
        w.write_bytes(weights)
        result = validate_adapter_files(
            c,
            w,
            fingerprint=fingerprint,
            max_lora_rank=64,
            max_config_bytes=1 << 20,
            max_weights_bytes=1 << 24,
            base_model_name="tiny-llama",
        )
        assert isinstance(result, ValidationResult)
        assert result.checks and all(
            isinstance(c.message, str) and c.message for c in result.checks
        )
        if result.ok:
            with safe_open(w, framework="numpy") as f:  # passed means it really opens
                assert set(f.keys())
        else:
            assert result.summary()
    return result


@FAST
@given(data=st.binary(max_size=4096))
def test_random_bytes_are_rejected_with_a_message(good, data):
    config, _, fingerprint = good
    assert not validate(config, data, fingerprint).ok


@FAST
@given(
    edits=st.lists(
        st.tuples(st.integers(min_value=0), st.integers(0, 255)), min_size=1, max_size=8
    ),
    cut=st.none() | st.integers(min_value=0),
)
def test_flipped_bytes_and_truncations_give_a_result(good, edits, cut):
    config, weights, fingerprint = good
    data = bytearray(weights)
    for position, value in edits:
        data[position % len(data)] = value
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    validate(config, bytes(data), fingerprint)


@FAST
@given(length=st.integers(min_value=0, max_value=2**64 - 1))
def test_any_header_length_gives_a_result(good, length):
    config, weights, fingerprint = good
    validate(config, struct.pack("<Q", length) + weights[8:], fingerprint)


@FAST
@given(
    field=st.sampled_from(["dtype", "shape", "data_offsets", "extra"]),
    value=JSON,
    which=st.integers(0),
)
def test_mutated_header_entries_give_a_result(good, field, value, which):
    config, weights, fingerprint = good
    header, body = edit.split(weights)
    names = [k for k in header if k != "__metadata__"]
    header[names[which % len(names)]][field] = value
    validate(config, edit.join(header, body), fingerprint)


@FAST
@given(header=JSON, body=st.binary(max_size=256))
def test_arbitrary_json_headers_give_a_result(good, header, body):
    config, _, fingerprint = good
    validate(config, edit.join(json.dumps(header).encode(), body), fingerprint)


@FAST
@given(
    changes=st.dictionaries(
        st.sampled_from(
            [
                "r",
                "lora_alpha",
                "peft_type",
                "target_modules",
                "use_dora",
                "modules_to_save",
                "rank_pattern",
                "alpha_pattern",
                "ensure_weight_tying",
                "auto_mapping",
                "use_rslora",
                "base_model_name_or_path",
                "bias",
            ]
        ),
        JSON,
        max_size=4,
    )
)
def test_mutated_configs_give_a_result(good, changes):
    config, weights, fingerprint = good
    validate(json.dumps(json.loads(config) | changes).encode(), weights, fingerprint)


@FAST
@given(config=st.binary(max_size=512))
def test_random_config_bytes_give_a_result(good, config):
    _, weights, fingerprint = good
    validate(config, weights, fingerprint)
