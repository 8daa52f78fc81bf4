"""Kernel variants without a GPU: which ones the engine can launch (variants.py, for the
shapes of shapes.py), their keys (launches.py), compiling them for a target that is not
here (target.py, compile.py) and what they cost on it (resources.py, report.py); and a
count of what Triton compiles (counting.py). Run `python -m inference.kernels.compilation`
for the compile table. Nothing here imports Django; importing it imports triton."""

from .counting import count_compilations
from .launches import LaunchKey, launch_key, recorded_launches
from .shapes import EngineShapes

__all__ = ["EngineShapes", "LaunchKey", "count_compilations", "launch_key", "recorded_launches"]
