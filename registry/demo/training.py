"""Train a LoRA adapter with PEFT: the loss on the completion's tokens only, seeded, on the CPU.

Rows have the eval-set shape and are tokenised as the engines' scoring endpoint tokenises
them (a chat row's completion followed by the template's end-of-turn token when that token
ends generation), so an adapter trained on chat rows answers in the engine's chat format
and learns to end its turn.

Used by `manage.py train_demo_adapters` and the quality gate's tests. transformers and peft
are development requirements, never runtime ones: imported only when called.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"

_TURN_MARK = "\u2063loraplex-completion\u2063"


def _eos_ids(tokenizer, model_dir: Path) -> set[int]:
    """The ids that end generation: the tokenizer's eos and config.json's and
    generation_config.json's eos_token_id, as the engine's Tokenizer gathers them."""
    ids = set() if tokenizer.eos_token_id is None else {tokenizer.eos_token_id}
    for name in ("config.json", "generation_config.json"):
        file = model_dir / name
        if file.is_file():
            value = json.loads(file.read_text()).get("eos_token_id")
            if isinstance(value, int):
                value = [value]
            ids |= set(value or ())
    return ids


def _end_of_turn(tokenizer, eos_ids: set[int]) -> list[int]:
    """The token the chat template writes right after an assistant's text, if it ends
    generation, as the scoring endpoint finds it."""
    turn = [{"role": "user", "content": "?"}, {"role": "assistant", "content": _TURN_MARK}]
    rendered = tokenizer.apply_chat_template(turn, add_generation_prompt=False, tokenize=False)
    _, found, after = rendered.partition(_TURN_MARK)
    ids = tokenizer.encode(after, add_special_tokens=False) if found else []
    return ids[:1] if ids and ids[0] in eos_ids else []


class RowEncoder:
    """(prompt ids, completion ids) of eval rows, as the scoring endpoint encodes them."""

    def __init__(self, model_dir: str | Path):
        from transformers import AutoTokenizer

        self.model_dir = Path(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(str(self.model_dir))
        self._turn_end: list[int] | None = None

    @property
    def turn_end(self) -> list[int]:
        if self._turn_end is None:
            eos = _eos_ids(self.tokenizer, self.model_dir)
            self._turn_end = _end_of_turn(self.tokenizer, eos)
        return self._turn_end

    def __call__(self, row: dict) -> tuple[list[int], list[int]]:
        tok = self.tokenizer
        completion = tok.encode(row["completion"], add_special_tokens=False)
        if "messages" in row:
            text = tok.apply_chat_template(
                row["messages"], add_generation_prompt=True, tokenize=False
            )
            return tok.encode(text, add_special_tokens=False), completion + self.turn_end
        return tok.encode(row["prompt"]), completion


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Torch on `threads` threads for the block (None: leave the setting), restored after.
    For a tiny model one thread is fastest: more only wait for each other."""
    import torch

    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def load_base(base_dir: str | Path):
    """The base model in fp32, as a transformers model."""
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)


def quietly(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call PEFT without transformers' deprecation notes about the calls it makes."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return fn(*args, **kwargs)


def _batch(encoded: Sequence[tuple[list[int], list[int]]]):
    """Right-padded input ids, attention mask and labels (-100 outside the completions)."""
    import torch

    width = max(len(p) + len(c) for p, c in encoded)
    ids = torch.zeros((len(encoded), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    labels = torch.full_like(ids, -100)
    for i, (prompt, completion) in enumerate(encoded):
        row = prompt + completion
        ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
        labels[i, len(prompt) : len(row)] = torch.tensor(completion)
    return ids, mask, labels


def _completion_loss(model, ids, mask, labels):
    """Mean negative log-likelihood of the completion tokens. The output head runs only at
    the positions that predict one: with a 49k vocabulary it is a fifth of the model."""
    import torch

    base = model.get_base_model()
    hidden = base.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state
    targets = labels[:, 1:]
    scored = targets != -100
    logits = base.get_output_embeddings()(hidden[:, :-1][scored]).float()
    return torch.nn.functional.cross_entropy(logits, targets[scored])


def _order(n: int, batch_size: int, steps: int, seed: int) -> Iterator[list[int]]:
    """Row indices of each step's batch: the rows in a seeded new order every epoch (in
    their own order when one batch holds them all)."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    done = 0
    while True:
        order = list(range(n)) if batch_size >= n else torch.randperm(n, generator=generator)
        for start in range(0, n, batch_size):
            if done == steps:
                return
            yield [int(i) for i in order[start : start + batch_size]]
            done += 1


def train_lora(
    base_dir: str | Path,
    dest: str | Path,
    rows: Sequence[dict],
    *,
    rank: int = 8,
    alpha: int = 16,
    targets: Sequence[str] = ALL_LINEAR,
    lr: float = 1e-3,
    epochs: int = 1,
    steps: int | None = None,
    batch_size: int | None = None,
    seed: int = 0,
    threads: int | None = None,
    base_model_name: str | None = None,
    weights_dtype: str | None = None,
    log: Callable[[str], None] | None = None,
) -> Path:
    """Train a LoRA adapter for the model in `base_dir` on `rows` and save it in `dest` (PEFT's
    `save_pretrained`: adapter_config.json + adapter_model.safetensors); returns `dest`.

    AdamW (no weight decay) on batches of `batch_size` rows (None: all rows in one batch) for
    `epochs` passes over the rows, or exactly `steps` steps when given; fp32, seeded.
    `base_model_name` overrides `base_model_name_or_path` in the saved config (default: the
    folder's name); `weights_dtype` ("float16", "bfloat16") stores the factors in that dtype,
    halving the file. `log` receives one line per step with its loss. Only the two files
    land in `dest`, each replaced whole.
    """
    import torch

    encode = RowEncoder(base_dir)
    encoded = [encode(row) for row in rows]
    batch_size = batch_size or len(encoded)
    steps = epochs * math.ceil(len(encoded) / batch_size) if steps is None else steps
    torch.manual_seed(seed)  # before PEFT draws the factors' initial values
    model = _lora_model(base_dir, rank=rank, alpha=alpha, targets=targets)
    with torch_threads(threads):
        _fit(model, encoded, batch_size=batch_size, steps=steps, lr=lr, seed=seed, log=log)
    model.eval()
    dest = Path(dest)
    _save(
        model,
        dest,
        base_model_name=base_model_name or Path(base_dir).name,
        weights_dtype=weights_dtype,
    )
    return dest


def _lora_model(base_dir: str | Path, *, rank: int, alpha: int, targets: Sequence[str]):
    """The base model with new LoRA factors on `targets`, in training mode."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=list(targets),
        lora_dropout=0.0,
        task_type="CAUSAL_LM",
    )
    model = quietly(get_peft_model, load_base(base_dir), lora)
    model.train()
    return model


def _fit(
    model,
    encoded: Sequence[tuple[list[int], list[int]]],
    *,
    batch_size: int,
    steps: int,
    lr: float,
    seed: int,
    log: Callable[[str], None] | None,
) -> None:
    """`steps` AdamW steps (no weight decay) on the completion loss of `_order`'s batches."""
    import torch

    optimizer = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0
    )
    for step, picked in enumerate(_order(len(encoded), batch_size, steps, seed), 1):
        optimizer.zero_grad()
        loss = _completion_loss(model, *_batch([encoded[i] for i in picked]))
        loss.backward()
        optimizer.step()
        if log is not None:
            log(f"step {step}/{steps}: loss {loss.item():.3f}")


def _save(model, dest: Path, *, base_model_name: str, weights_dtype: str | None) -> None:
    """PEFT's two files into `dest`, each replaced whole, and nothing else."""
    import torch

    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=dest) as saved_dir:
        model.save_pretrained(saved_dir)  # also writes a model card: keep only the two files
        saved = Path(saved_dir)
        if weights_dtype is not None:
            _store_as(saved / WEIGHTS_FILE, getattr(torch, weights_dtype))
        config = json.loads((saved / CONFIG_FILE).read_text())
        config["base_model_name_or_path"] = base_model_name
        (saved / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            os.replace(saved / name, dest / name)


def _store_as(weights: Path, dtype) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    with safe_open(str(weights), framework="pt") as f:
        metadata = f.metadata()
        tensors = {name: f.get_tensor(name).to(dtype).contiguous() for name in sorted(f.keys())}
    save_file(tensors, str(weights), metadata=metadata)
