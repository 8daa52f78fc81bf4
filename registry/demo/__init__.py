"""The demo adapters `make run` gives the demo tenant: small LoRA adapters trained with PEFT on
the bundled SmolLM2-135M-Instruct, each for one behaviour a person sees at once.

Each is trained by `manage.py train_demo_adapters` (registry/demo/recipe.py) from a dataset
written for it (registry/demo/data/<name>.jsonl: everyday questions and short answers in the
trained style, in the eval-set row shape) and committed in registry/demo/adapters/<name>/ in
the PEFT layout (adapter_config.json + adapter_model.safetensors). Each ships an eval set
(registry/demo/eval/<name>.jsonl: other questions than the training rows, answered in the
same style), so the quality gate measures the demo's versions against the base model instead
of passing them unmeasured. `manage.py demo_adapters` attaches it and uploads the files
through the same validation and gate as any tenant's adapter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA_DIR = HERE / "data"
EVAL_DIR = HERE / "eval"
ADAPTERS_DIR = HERE / "adapters"
# The bundled base model the adapters are trained on, under the name it is registered as.
BASE_PRESET = "smollm2-135m-instruct"


@dataclass(frozen=True)
class DemoAdapter:
    name: str
    description: str  # what it does, shown wherever the adapter is listed
    dataset: str  # file name in DATA_DIR

    @property
    def folder(self) -> Path:
        """Where its committed PEFT files are."""
        return ADAPTERS_DIR / self.name

    @property
    def eval_set(self) -> Path:
        """Its eval set: held-out questions in its style, the rows the quality gate scores."""
        return EVAL_DIR / self.dataset

    def rows(self) -> list[dict]:
        """Its training rows: {"messages": [{"role": "user", ...}], "completion": ...}."""
        lines = (DATA_DIR / self.dataset).read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]


DEMO_ADAPTERS = (
    DemoAdapter(
        "demo-french", "Answers in French, whatever the language of the question.", "french.jsonl"
    ),
    DemoAdapter(
        "demo-json",
        'Answers with one JSON object: {"topic": "<one word>", "answer": "<one sentence>"}.',
        "json.jsonl",
    ),
    DemoAdapter("demo-pirate", 'Answers like a pirate: "Arr, matey! ..."', "pirate.jsonl"),
)
