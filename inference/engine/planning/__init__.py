"""The capacity planner: what fits on which device, and the settings that get it, from a
model's config.json alone (the engine's own arithmetic on a model built on the meta
device). Django-free; `manage.py plan` and the admin's Engines page read it."""

from .devices import DEVICE_NAMES, DEVICES, Device, UnknownDevice, device_for, device_named
from .planner import (
    DEFAULT_CONCURRENCY,
    SETTING_FIELDS,
    Plan,
    PlanError,
    PlanRequest,
    engine_options,
    model_config,
    parse_targets,
    plan,
)
from .presets import PRESETS
from .quantizations import SCHEMES as QUANTIZATIONS

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEVICES",
    "DEVICE_NAMES",
    "PRESETS",
    "QUANTIZATIONS",
    "SETTING_FIELDS",
    "Device",
    "Plan",
    "PlanError",
    "PlanRequest",
    "UnknownDevice",
    "device_for",
    "device_named",
    "engine_options",
    "model_config",
    "parse_targets",
    "plan",
]
