"""Fixtures of the LoRA engine tests (see lora_fixtures.py)."""

from tests.engine.lora_fixtures import adapters, lora_model_dir  # noqa: F401
