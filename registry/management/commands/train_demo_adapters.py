"""Retrain the demo adapters from their datasets (maintainers; needs requirements-dev.txt)."""

import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from inference.engine import EngineError
from inference.engine.formats.convert import ensure_converted
from registry.demo import ADAPTERS_DIR, BASE_PRESET, DEMO_ADAPTERS
from registry.demo.recipe import EPOCHS, train_demo_adapter


def _positive(value: str) -> int:
    number = int(value)
    if number < 1:
        raise ValueError(value)
    return number


class Command(BaseCommand):
    help = (
        "Train the demo adapters with PEFT on the bundled SmolLM2 from registry/demo/data and "
        "write them to registry/demo/adapters (what `make run` serves); --steps/--out for a "
        "quick trial."
    )

    def add_arguments(self, parser):
        names = [a.name for a in DEMO_ADAPTERS]
        parser.add_argument("names", nargs="*", metavar="NAME", help=f"default: all of {names}")
        parser.add_argument("--out", type=Path, default=ADAPTERS_DIR, help="writes OUT/<name>/")
        budget = parser.add_mutually_exclusive_group()
        budget.add_argument("--epochs", type=_positive, default=EPOCHS)
        budget.add_argument("--steps", type=_positive, help="exactly this many steps")
        parser.add_argument(
            "--base-dir",
            type=Path,
            help="the base model's Hugging Face folder (default: the bundled preset, "
            "converted into $LORAPLEX_MODELS_DIR as import_base_model does)",
        )
        parser.add_argument("--threads", type=_positive, default=1)

    def handle(self, names, out, epochs, steps, base_dir, threads, **options):
        known = {a.name: a for a in DEMO_ADAPTERS}
        unknown = sorted(set(names) - set(known))
        if unknown:
            raise CommandError(f"unknown demo adapter(s) {unknown}; known: {sorted(known)}")
        try:
            import peft  # noqa: F401
        except ImportError:
            raise CommandError(
                "training needs the development requirements: "
                "pip install -c constraints.txt -r requirements-dev.txt"
            ) from None
        if base_dir is None:
            try:
                base_dir = ensure_converted(BASE_PRESET, settings.MODELS_DIR / BASE_PRESET)
            except EngineError as exc:
                raise CommandError(str(exc)) from None
        elif not (base_dir / "config.json").is_file():
            raise CommandError(f"--base-dir {base_dir} is not a Hugging Face model folder")
        for adapter in [known[n] for n in names] if names else DEMO_ADAPTERS:
            started = time.monotonic()
            dest = train_demo_adapter(
                adapter,
                base_dir,
                out / adapter.name,
                epochs=epochs,
                steps=steps,
                threads=threads,
                log=lambda line, name=adapter.name: self.stdout.write(f"{name}: {line}"),
            )
            size = sum(f.stat().st_size for f in dest.iterdir())
            self.stdout.write(
                f"{adapter.name}: {size:,} bytes in {dest} ({time.monotonic() - started:.0f} s)"
            )
