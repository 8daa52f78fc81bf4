"""A real LoRA adapter trained in the test, its eval set, a reference scorer and noisy bases.

For the quality gate's tests (issue 13): an adapter learnt by gradient descent (not random
factors like tests/peft_adapters.py) on a small synthetic task, so that its perplexity on a
held-out eval split is far below the base model's; the same figures computed independently
with transformers + PEFT in fp32, to compare the platform's scoring with; and copies of the
base model with Gaussian noise added to its weights, a new revision with the same
architecture, either degrading the adapter (`DEGRADING_NOISE`) or not (`HARMLESS_NOISE`).

The task: always answer in a fixed format. A question `Q: <word>` (a word: 3 to 6 random
lower case letters) is answered `ANSWER` whatever the word, which generalises to the held-out
words of the eval split. (Copying the word into the answer was tried: the tiny model does not
learn to copy in a few dozen steps, and its eval perplexity, dominated by the word's
near-random tokens, moved erratically under noise.) Rows come as the eval-set JSONL shape,
`{"prompt": ..., "completion": ...}` or (chat=True) `{"messages": [...], "completion": ...}`;
the tiny test model's tokenizer has a ChatML template, so both work.

The adapter's eval perplexity levels off near 2 (the base's is about 530): the tiny model's
output logits are bounded (RMS-normed hidden state times a tied embedding of std 0.1) and
the adapter may not touch the embeddings, so no token gets a probability much above 0.5.

Tokens are counted as the scoring endpoint counts them (inference/operator/scoring.py): a text
prompt encoded as /v1/completions encodes it, a chat prompt rendered with the template's
generation prompt and encoded without special tokens; the completion encoded without special
tokens, followed in a chat row by the template's end-of-turn token (`<|im_end|>`) when that
token ends generation. Training uses the same ids, so it also learns to end its turn (both
in registry/demo/training.py, which trains the demo adapters too).

Timings on a busy 2-core CPU machine with the tiny model of tests/tiny_llama.py (2 layers,
hidden 64), after imports (torch + transformers + peft take about 3.5 s): `train_adapter` with
its defaults (32 rows, 40 full-batch steps) 0.8-1.0 s for prompt rows, 1.7-1.9 s for chat rows;
`reference_nll` on 16 rows about 0.1 s; `noisy_copy` a few milliseconds. Both run torch on one
thread (and restore the setting): on this model two threads were ten times slower.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import string
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import NamedTuple

from registry.demo.training import (
    ALL_LINEAR,
    RowEncoder,
    load_base,
    quietly,
    torch_threads,
    train_lora,
)

ANSWER = "A: ok, noted !"  # the fixed answer the adapter learns
TRAIN_ROWS = 32
EVAL_ROWS = 16

# Relative Gaussian noise for `noisy_copy`. Measured with `reference_nll` on the tiny model
# (make_tiny_llama defaults), the adapter `train_adapter` makes with its defaults, and the eval
# split of `task_rows()`: the adapter's eval perplexity on the noisy base over its perplexity
# on the original base. With the defaults (seed 0 everywhere) for prompt rows / chat rows, then
# the range over training seeds 0-3 x noise seeds 0-2 x both row shapes (24 pairs):
#   scale 0.01: 0.9991 / 0.9997, range 0.9991-1.0007   (harmless: far within x1.10)
#   scale 0.03: 0.9986 / 1.0016, range 0.9986-1.0051
#   scale 0.3:  1.205  / 1.512,  range 1.18-2.19       (degrades, but not by much every time)
#   scale 0.5:  2.433  / 4.526,  range 2.13-13.8       (degrading: far beyond x1.10)
#   scale 0.7:  10.6   / 31.9,   range 6.8-70
# For scale, the base's own eval perplexity is about 530 and the adapter's about 1.98.
DEGRADING_NOISE = 0.5
HARMLESS_NOISE = 0.01
QUALITY_FACTOR = 1.10  # the gate's default factor (issue 13)


class TaskRows(NamedTuple):
    train: list[dict]
    eval: list[dict]


# ---------------------------------------------------------------- the task


def _word(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 6)))


def task_row(word: str, *, chat: bool = False) -> dict:
    """One row of the task: whatever the question, the answer is `ANSWER`."""
    if chat:
        return {"messages": [{"role": "user", "content": f"Q: {word}"}], "completion": ANSWER}
    return {"prompt": f"Q: {word}\n", "completion": ANSWER}


def task_rows(
    n: int = TRAIN_ROWS, seed: int = 0, *, eval_n: int = EVAL_ROWS, chat: bool = False
) -> TaskRows:
    """`n` training rows and `eval_n` eval rows on distinct words (no word in both)."""
    rng = random.Random(seed)
    words: list[str] = []
    while len(words) < n + eval_n:
        word = _word(rng)
        if word not in words:
            words.append(word)
    rows = [task_row(w, chat=chat) for w in words]
    return TaskRows(rows[:n], rows[n:])


def eval_set_jsonl(rows: Iterable[dict]) -> bytes:
    """The rows as an eval-set upload: one JSON object per line, UTF-8."""
    return "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()


# ---------------------------------------------------------------- models


def train_adapter(
    base_dir: str | Path,
    dest: str | Path,
    *,
    rows: Sequence[dict] | None = None,
    steps: int = 40,
    rank: int = 8,
    alpha: int = 16,
    lr: float = 1e-2,
    targets: Sequence[str] = ALL_LINEAR,
    seed: int = 0,
    base_model_name: str | None = None,
) -> Path:
    """Train a LoRA adapter for the model in `base_dir` on `rows` (default: the training split
    of `task_rows()`) and save it in `dest`; returns `dest`.

    Full-batch AdamW for `steps` steps on the mean negative log-likelihood of the completion
    tokens (encoded as the scoring endpoint encodes them), fp32 on the CPU, one thread, seeded
    (registry/demo/training.py, which the demo adapters are trained with too).
    `base_model_name` overrides `base_model_name_or_path` in the saved config.
    """
    rows = list(rows) if rows is not None else task_rows().train
    return train_lora(
        base_dir,
        dest,
        rows,
        rank=rank,
        alpha=alpha,
        targets=targets,
        lr=lr,
        steps=steps,
        seed=seed,
        threads=1,
        base_model_name=base_model_name,
    )


def reference_nll(base_dir: str | Path, adapter_dir: str | Path | None, rows: Sequence[dict]):
    """The scoring endpoint's figures, computed with transformers (+ PEFT) in fp32.

    {"rows": [{"tokens", "nll"}] (each row's summed negative log-likelihood of its completion
    tokens), "tokens", "nll" (the mean per token over all rows), "perplexity" (exp of it)}.
    `adapter_dir` None scores the base model alone.
    """
    import torch

    encode = RowEncoder(base_dir)
    model = load_base(base_dir)
    if adapter_dir is not None:
        from peft import PeftModel

        model = quietly(PeftModel.from_pretrained, model, str(adapter_dir))
    model.eval()
    scored = []
    with torch.no_grad(), torch_threads(1):
        for row in rows:
            prompt, completion = encode(row)
            ids = torch.tensor([prompt + completion])
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            logprobs = torch.log_softmax(logits, dim=-1)
            picked = logprobs.gather(1, torch.tensor(completion)[:, None])[:, 0]
            scored.append({"tokens": len(completion), "nll": -float(picked.double().sum())})
    tokens = sum(r["tokens"] for r in scored)
    mean = sum(r["nll"] for r in scored) / tokens
    return {"rows": scored, "tokens": tokens, "nll": mean, "perplexity": math.exp(mean)}


# ---------------------------------------------------------------- new base revisions


def noisy_copy(model_dir: str | Path, dest: str | Path, *, scale: float, seed: int = 0) -> Path:
    """A copy of the Hugging Face folder `model_dir` in `dest` whose every weight matrix
    (2-D tensor: projections, and the embeddings, which the tiny model ties to its output
    head) has Gaussian noise added, `scale` times the matrix's root mean square per entry;
    1-D tensors (the RMSNorm weights) are kept, and every other file is copied as it is.
    Same architecture and config, different weights: a new revision. Returns `dest`."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    model_dir, dest = Path(model_dir), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    generator = torch.Generator().manual_seed(seed)
    for file in sorted(model_dir.iterdir()):
        if not file.is_file():
            continue
        if file.suffix != ".safetensors":
            shutil.copy2(file, dest / file.name)
            continue
        with safe_open(str(file), framework="pt") as f:
            metadata = f.metadata()
            tensors = {name: f.get_tensor(name) for name in sorted(f.keys())}
        for name, tensor in tensors.items():
            if tensor.ndim < 2 or not tensor.is_floating_point():
                continue
            weights = tensor.float()
            rms = weights.pow(2).mean().sqrt()
            noise = torch.randn(weights.shape, generator=generator) * (scale * rms)
            tensors[name] = (weights + noise).to(tensor.dtype).contiguous()
        save_file(tensors, str(dest / file.name), metadata=metadata)
    return dest
