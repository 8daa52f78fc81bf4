"""The bundled SmolLM2 model as a converted Hugging Face folder, shared by every test.

Converting takes several seconds and half a gigabyte, so it happens once per checkout into
`$LORAPLEX_VAR_DIR/models/smollm2-135m-instruct` (default `var/` at the repo root) and is reused.
Concurrent test processes are safe: each converts into a private temp folder and the first
rename wins (see `ensure_converted`).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from inference.engine.formats.convert import ensure_converted

PRESET = "smollm2-135m-instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def var_dir() -> Path:
    default = Path(__file__).resolve().parents[1] / "var"
    return Path(os.environ.get("LORAPLEX_VAR_DIR") or default)


@functools.cache
def smollm2_dir() -> Path:
    return ensure_converted(PRESET, var_dir() / "models" / PRESET)
