"""The emulated device's clock: a step waits as a CUDA synchronisation does (the GIL
released, so the HTTP side and the loaders run meanwhile), and its busy time is counted."""

import time


class EmulatedDevice:
    def __init__(self, name: str):
        self.name = name
        self.busy_seconds = 0.0  # the cost model's time for every step and copy run
        self.steps = 0
        self.sleeps = True  # False: a simulation's virtual clock counts the time instead

    def run(self, seconds: float, step: bool = True) -> None:
        """One step's kernels, from launch to the host's sync (step False: a copy queued on
        the same stream, which the next step waits behind)."""
        if self.sleeps:
            time.sleep(seconds)  # releases the GIL, as a CUDA sync does
        self.busy_seconds += seconds
        self.steps += step
