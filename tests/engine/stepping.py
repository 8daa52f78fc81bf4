"""Driving the engine one step at a time, for tests that check each step's logits."""

import torch

from inference.engine import LLMEngine
from inference.engine.sequence import Sequence


def step_logits(engine: LLMEngine) -> list[tuple[Sequence, torch.Tensor]]:
    """Schedule and run one forward pass without sampling: each sequence that now needs its
    next token, with its logits row. The caller appends the token it chooses. Waits for
    adapter loads while nothing can run."""
    while True:
        if engine.lora_manager is not None:
            assert not engine.lora_manager.poll(), "an adapter failed to load"
        batch = engine.scheduler.schedule()
        if batch:
            break
        assert engine.wait_for_load(1.0), "nothing to run and no adapter loading"
    step = engine.model_runner.compute_logits(batch)
    engine.scheduler.mark_computed(batch)
    return list(zip(step.samplers, step.logits, strict=True))
