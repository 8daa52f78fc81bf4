"""Greedy tokens and logits of the engine against transformers on the same random model.

Both generate greedily from one prompt. Every step's logits row of the engine is recorded
(by wrapping its runner's `compute_logits`, which the step calls anyway) and compared with
transformers' logits for the same tokens (one teacher-forced forward over the prompt and the
engine's tokens). Where the two token streams part, the divergence is explained when it is
a near-tie: at that step the two candidates' logits differ, in both models, by no more than
twice the largest logit disagreement seen so far plus one bf16 step at that magnitude.
"""

from typing import Any

import torch


class LogitsRecorder:
    """Keeps the sampled rows' logits of every step a model runner computes."""

    def __init__(self, runner: Any):
        self.rows: list[torch.Tensor] = []
        self.runner, self.inner = runner, runner.compute_logits
        runner.compute_logits = self

    def __call__(self, batch: Any) -> Any:
        step = self.inner(batch)
        self.rows.append(step.logits.detach().float().cpu())
        return step

    def close(self) -> None:
        self.runner.compute_logits = self.inner


def first_divergence(ours: list[int], theirs: list[int]) -> int | None:
    return next((i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b), None)


def tie_explains(
    step: int,
    ours: list[int],
    theirs: list[int],
    our_logits: torch.Tensor,
    their_logits: torch.Tensor,
    bf16_steps: bool,
) -> dict[str, Any]:
    """Whether the choice at `step` was a near-tie in both models (see the module doc)."""
    a, b = ours[step], theirs[step]
    err = (our_logits[: step + 1] - their_logits[: step + 1]).abs().max().item()
    top = max(our_logits[step].abs().max().item(), their_logits[step].abs().max().item())
    ulp = top * 2.0**-7 if bf16_steps else 0.0  # bf16 keeps 8 significant bits
    tolerance = 2 * err + ulp
    our_gap = (our_logits[step, a] - our_logits[step, b]).item()
    their_gap = (their_logits[step, b] - their_logits[step, a]).item()
    return {
        "step": step,
        "engine_token": a,
        "transformers_token": b,
        "engine_gap": round(our_gap, 5),
        "transformers_gap": round(their_gap, 5),
        "tolerance": round(tolerance, 5),
        "explained_by_near_tie": max(our_gap, their_gap) <= tolerance,
    }


def compare_greedy(
    engine: Any, hf_model: Any, prompt: list[int], new_tokens: int, bf16: bool
) -> dict[str, Any]:
    """Engine vs transformers, greedy, `new_tokens` tokens from `prompt`."""
    from inference.engine import SamplingParams

    recorder = LogitsRecorder(engine.model_runner)
    try:
        params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True)
        [out] = engine.generate([prompt], params)
    finally:
        recorder.close()
    ours = list(out.token_ids)
    if out.error is not None or len(ours) != new_tokens:
        raise RuntimeError(f"the engine made {len(ours)} of {new_tokens} tokens: {out.error}")
    our_logits = torch.cat(recorder.rows)  # one row per step: batch of one
    device = next(hf_model.parameters()).device
    ids = torch.tensor([prompt], device=device)
    with torch.no_grad():
        generated = hf_model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        )
        theirs = generated[0, len(prompt) :].tolist()
        forced = torch.tensor([prompt + ours[:-1]], device=device)
        their_logits = hf_model(forced).logits[0, len(prompt) - 1 :].float().cpu()
    diff = (our_logits - their_logits).abs()
    scale = their_logits.abs().max().item()
    step = first_divergence(ours, theirs)
    figures: dict[str, Any] = {
        "tokens": new_tokens,
        "prompt_tokens": len(prompt),
        "tokens_equal": step is None,
        "equal_prefix": new_tokens if step is None else step,
        "max_logit_abs_err": float(f"{diff.max().item():.4g}"),
        "max_logit_rel_err": float(f"{diff.max().item() / max(scale, 1e-6):.4g}"),
        "max_abs_logit": round(scale, 3),
    }
    if step is not None:
        figures["divergence"] = tie_explains(step, ours, theirs, our_logits, their_logits, bf16)
    figures["correct"] = step is None or figures["divergence"]["explained_by_near_tie"]
    return figures
