"""How the demo adapters are trained: one recipe for all three, seeded, fit for a CPU.

Rank 8 on the attention's q, v and o projections of every layer, stored in fp16: about
1.5 MB per adapter, small enough to commit. Settings chosen on a busy 2-core CPU so that a
full run of all three stays within minutes and each adapter's greedy answers to questions
it never saw show its style (tests/test_demo_adapters.py checks that on the committed files).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from . import BASE_PRESET, DemoAdapter
from .training import train_lora

RANK = 8
ALPHA = 16
TARGETS = ("q_proj", "v_proj", "o_proj")
LEARNING_RATE = 2e-3
EPOCHS = 2
BATCH_SIZE = 8
SEED = 0
WEIGHTS_DTYPE = "float16"


def train_demo_adapter(
    adapter: DemoAdapter,
    base_dir: str | Path,
    dest: str | Path,
    *,
    epochs: int = EPOCHS,
    steps: int | None = None,
    threads: int | None = 1,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Train `adapter` on its dataset over the base model in `base_dir` into `dest`.

    `steps` (a few) instead of `epochs` gives a quick run that exercises everything. One
    thread: on a shared 2-core machine a second thread mostly waits for the first.
    """
    return train_lora(
        base_dir,
        dest,
        adapter.rows(),
        rank=RANK,
        alpha=ALPHA,
        targets=TARGETS,
        lr=LEARNING_RATE,
        epochs=epochs,
        steps=steps,
        batch_size=BATCH_SIZE,
        seed=SEED,
        threads=threads,
        base_model_name=BASE_PRESET,
        weights_dtype=WEIGHTS_DTYPE,
        log=log,
    )
