from pathlib import Path

from django.core.management.base import BaseCommand, CommandError

from registry.errors import RegistryError
from registry.selectors import base_model_find, base_model_names
from registry.services.eval_sets import eval_set_attach_default

ACTOR = "system:operator"


class Command(BaseCommand):
    help = (
        "Set a base model's generic eval set: the JSONL rows every adapter on it without its "
        "own eval set is measured on. Replaces the current one; identical bytes change nothing."
    )

    def add_arguments(self, parser):
        parser.add_argument("base_model", help="the base model's name")
        parser.add_argument("file", type=Path, help="the eval set, JSONL")

    def handle(self, base_model, file, **options):
        found = base_model_find(name=base_model)
        if found is None:
            known = ", ".join(base_model_names()) or "none"
            raise CommandError(f"no base model named {base_model!r}; known: {known}")
        try:
            with open(file, "rb") as f:
                eval_set, created = eval_set_attach_default(base_model=found, file=f, actor=ACTOR)
        except OSError as exc:
            raise CommandError(f"cannot read {file}: {exc.strerror or exc}") from None
        except RegistryError as exc:
            raise CommandError(f"{file}: {exc.message}") from None
        state = "now current" if created else "unchanged (the current set has these bytes)"
        self.stdout.write(
            f"{found.name}: generic eval set of {eval_set.rows} rows ({eval_set.size} bytes, "
            f"sha256 {eval_set.sha256[:12]}) {state}"
        )
