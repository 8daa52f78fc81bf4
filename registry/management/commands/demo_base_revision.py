"""A second revision of the demo's base model, to try the quality gate's base upgrade: the
same SmolLM2 with every weight matrix nudged by seeded noise, imported under the same name.

Importing it is what an operator's upgrade is: every adapter version on the base becomes
pending, is re-checked, then re-evaluated once an engine serves the new weights (restart
`make run`). On the demo adapters' eval sets: 0.01 moves perplexities by about 1% (all
pass), 0.05 degrades demo-french (about x1.2 against x1.10) while the other two pass, 0.2
degrades all three.
"""

import shutil
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from registry.demo import BASE_PRESET
from registry.errors import RegistryError
from registry.selectors import base_model_find
from registry.services.base_models import base_model_import


class Command(BaseCommand):
    help = (
        "Import a new revision of a base model (default: the demo's) whose weight matrices are "
        "nudged by seeded noise, to try a base upgrade and the quality gate's re-evaluation."
    )

    def add_arguments(self, parser):
        parser.add_argument("--name", default=BASE_PRESET)
        parser.add_argument(
            "--scale",
            type=float,
            default=0.01,
            help="relative noise on each weight matrix (0.01: the demo adapters pass; 0.05: "
            "demo-french is degraded; 0.2: all are)",
        )
        parser.add_argument("--seed", type=int, default=1)

    def handle(self, name, scale, seed, **options):
        if not 0 < scale <= 1:
            raise CommandError("--scale must be above 0 and at most 1")
        base = base_model_find(name=name)
        if base is None:
            raise CommandError(f"no base model named {name!r}: import it first")
        source = Path(base.local_path)
        out = settings.MODELS_DIR / f"{name}-noise{scale:g}-seed{seed}"
        if not (out / "config.json").is_file():
            _write_revision(source, out, scale=scale, seed=seed)
        try:
            row, changed = base_model_import(name=name, path=out)
        except RegistryError as exc:
            raise CommandError(exc.message) from None
        if not changed:
            self.stdout.write(f"{row.name} already serves revision {row.revision[:12]} ({out})")
            return
        self.stdout.write(
            f"{row.name} revision {row.revision[:12]} at {out}: every adapter version on it is "
            "pending; restart the engine (stop and start `make run`) to serve the new weights, "
            "and the worker re-evaluates each version there (the admin's base model page and "
            "each adapter's page show the figures before and after)"
        )


def _write_revision(source: Path, out: Path, *, scale: float, seed: int) -> None:
    """Copy the model folder with noise on its 2-D weights; written aside, then renamed."""
    import torch  # the engine's dependency: only this command needs it here
    from safetensors.torch import load_file, save_file

    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    generator = torch.Generator().manual_seed(seed)
    for path in sorted(source.iterdir()):
        if path.suffix != ".safetensors":
            if path.is_file():
                shutil.copy2(path, tmp / path.name)
            continue
        tensors = load_file(path)
        for key, tensor in sorted(tensors.items()):
            if tensor.ndim == 2 and tensor.is_floating_point():
                noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float32)
                tensors[key] = (tensor.float() * (1 + scale * noise)).to(tensor.dtype)
        save_file(tensors, tmp / path.name, metadata={"format": "pt"})
    tmp.rename(out)
