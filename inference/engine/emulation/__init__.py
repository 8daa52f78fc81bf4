"""An emulated device: the engine's host side runs for real, each step's device work is a
wait for the time the cost model gives the named GPU (planning/step_time.py)."""

from .device import EmulatedDevice
from .runner import EmulatedModelRunner
from .target import EmulationTarget

__all__ = ["EmulatedDevice", "EmulatedModelRunner", "EmulationTarget"]
