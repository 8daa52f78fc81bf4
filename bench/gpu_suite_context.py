"""What a GPU suite section is handed in its own process: the profile's sizes, the run's
shared folder (where serving_model leaves the served model and its adapters for the
sections after it), the entries of the sections that already finished, and the engine the
suite builds over a model folder. torch is imported when a section first asks for a device
or a dtype, so a section that needs neither starts without it."""

import json
from functools import cached_property
from pathlib import Path
from typing import Any

from gpu_suite_plan import EARLIER_FILE
from gpu_suite_profile import Profile


class Context:
    def __init__(self, profile: Profile, workdir: Path):
        self.profile = profile
        self.workdir = workdir
        self.tiny = profile.interpret
        if self.tiny:
            import torch

            torch.set_num_threads(1)  # a shared small CPU: threads waiting on each other add noise

    @cached_property
    def device(self) -> Any:
        import torch

        return torch.device(self.profile.device)

    @cached_property
    def dtype(self) -> Any:
        import torch

        return getattr(torch, self.profile.dtype)

    @property
    def served(self) -> Path:
        """The served model's folder (Llama-3-8B shapes on the GPU)."""
        return self.workdir / "served"

    def adapters(self) -> list[Path]:
        return sorted((self.workdir / "adapters").glob("adapter-*"))

    def earlier(self, section: str) -> dict[str, Any]:
        """A finished section's entry ({} when it has none or it did not end ok)."""
        path = self.workdir / EARLIER_FILE
        entries = json.loads(path.read_text()) if path.exists() else {}
        entry = entries.get(section, {})
        return entry if entry.get("status") == "ok" else {}

    def engine(self, folder: Path, **settings: Any) -> Any:
        from inference.engine import LLMEngine

        p = self.profile
        options = {
            "device": p.device, "dtype": p.dtype, "attention_backend": p.attention_backend,
            "max_model_len": p.max_model_len, "kv_cache_bytes": p.kv_cache_bytes,
            "block_size": p.block_size, **settings,
        }  # fmt: skip
        return LLMEngine(model=folder, **options)
