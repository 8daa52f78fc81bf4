from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from inference.engine import EngineError
from inference.engine.families import FAMILIES
from inference.engine.formats.convert import PRESETS, ensure_converted
from registry.errors import RegistryError
from registry.names import base_model_name_validator
from registry.selectors import base_model_find
from registry.services.base_models import base_model_import


class Command(BaseCommand):
    help = (
        "Import a base model: a bundled preset (converted into $LORAPLEX_MODELS_DIR/<name>) or a "
        "Hugging Face folder. A new revision of a known model (its FP8 or 4-bit checkpoint too) "
        "queues a compatibility re-check of every adapter version on it, then its re-evaluation "
        "(the quality gate). A quantization scheme the engine cannot serve is refused."
    )

    def add_arguments(self, parser):
        source = parser.add_mutually_exclusive_group(required=True)
        source.add_argument("--preset", choices=sorted(PRESETS))
        source.add_argument(
            "--hf-dir",
            type=Path,
            help=f"a Hugging Face model folder of an architecture the engine serves: "
            f"{', '.join(FAMILIES)}",
        )
        parser.add_argument("--name", help="required with --hf-dir; default: the preset's name")
        # The default base model: adapters created without naming one go on it, and `serve`
        # runs it unless LORAPLEX_BASE_MODEL names another. The first import becomes it.
        default = parser.add_mutually_exclusive_group()
        default.add_argument("--default", dest="default", action="store_true", default=None)
        default.add_argument("--no-default", dest="default", action="store_false")
        # `make run` at every start: a revision imported since (demo_base_revision) stays.
        parser.add_argument(
            "--if-missing",
            action="store_true",
            help="do nothing when a base model of this name is imported and its folder is there",
        )

    def handle(self, preset, hf_dir, name, default, if_missing, **options):
        name = name or preset
        if name is None:
            raise CommandError("--name is required with --hf-dir")
        known = base_model_find(name=name) if if_missing else None
        if known is not None and (Path(known.local_path) / "config.json").is_file():
            self.stdout.write(
                f"{known.name} revision {known.revision[:12]} at {known.local_path}: "
                "already imported, kept"
            )
            return
        try:
            base_model_name_validator(name)
        except Exception as exc:
            raise CommandError(
                f"--name: {' '.join(getattr(exc, 'messages', [str(exc)]))}"
            ) from None
        if preset:
            try:
                folder = ensure_converted(preset, settings.MODELS_DIR / name)
            except EngineError as exc:
                raise CommandError(str(exc)) from None
        else:
            folder = hf_dir
            if not folder.is_dir():
                raise CommandError(f"--hf-dir {folder} is not a folder")
        try:
            row, changed = base_model_import(name=name, path=folder, default=default)
        except RegistryError as exc:
            raise CommandError(exc.message) from None
        state = "new revision; compatibility re-check queued" if changed else "imported"
        role = "the default base model" if row.is_default else "not the default"
        scheme = f" ({row.quantization})" if row.quantization else ""
        self.stdout.write(
            f"{row.name} revision {row.revision[:12]}{scheme} at {row.local_path}: {state}, {role}"
        )
