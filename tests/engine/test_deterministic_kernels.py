"""The deterministic_kernels setting reaches every step's LoRA batch, where the Triton
kernels read it (tests/kernels/test_lora_triton.py checks what it changes there)."""

import pytest

from inference.engine import ConfigError, EngineConfig
from tests.engine.lora_fixtures import lora_engine


@pytest.mark.parametrize("deterministic", [False, True])
def test_every_step_batch_carries_the_setting(lora_model_dir, deterministic):
    engine = lora_engine(lora_model_dir, deterministic_kernels=deterministic)
    try:
        slots = engine.model_runner.lora_slots
        step = slots.make_step([0, -1, 1, 0])
        assert step is not None and step.batch.deterministic is deterministic
    finally:
        engine.close()


def test_a_deterministic_setting_that_is_not_a_switch_is_refused(lora_model_dir):
    with pytest.raises(ConfigError, match="deterministic_kernels must be true or false"):
        EngineConfig(model=lora_model_dir, enable_lora=True, deterministic_kernels="always")
