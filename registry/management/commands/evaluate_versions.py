from django.core.management.base import BaseCommand, CommandError

from registry.models import AdapterVersion, BaseModel
from registry.services.evaluations import evaluations_rerun

from ._versions import versions_named

ACTOR = "system:operator"
Quality = AdapterVersion.Quality


class Command(BaseCommand):
    help = (
        "Re-run the quality gate's evaluation of adapter versions on their base model's current "
        "revision (the worker scores them on the engine). Name versions as <tenant>/<adapter>:<n>, "
        "or select them: --quality failed re-runs those the engine could not measure, "
        "--unmeasured measures those accepted without figures. A version that passed here keeps "
        "serving meanwhile."
    )

    def add_arguments(self, parser):
        parser.add_argument("versions", nargs="*", help="<tenant>/<adapter>:<n>")
        parser.add_argument("--base-model", help="only versions on this base model")
        parser.add_argument(
            "--quality",
            action="append",
            choices=Quality.values,
            help="only versions in this quality state (repeatable)",
        )
        parser.add_argument(
            "--unmeasured",
            action="store_true",
            help="only versions without a reference figure (accepted unmeasured)",
        )

    def handle(self, versions, base_model, quality, unmeasured, **options):
        if versions and (base_model or quality or unmeasured):
            raise CommandError("name versions, or select them with options; not both")
        if not versions and not (base_model or quality or unmeasured):
            raise CommandError(
                "name versions, or select them: --base-model, --quality, --unmeasured"
            )
        if versions:
            selected = versions_named(versions)
        else:
            query = AdapterVersion.objects.filter(status=AdapterVersion.READY)
            if base_model:
                if not BaseModel.objects.filter(name=base_model).exists():
                    raise CommandError(f"no base model named {base_model!r}")
                query = query.filter(adapter__base_model__name=base_model)
            if quality:
                query = query.filter(quality__in=quality)
            if unmeasured:
                query = query.filter(reference_evaluation__isnull=True)
            selected = list(query.select_related("adapter__tenant").order_by("pk"))
        queued = evaluations_rerun(versions=selected, actor=ACTOR)
        for evaluation in queued:
            self.stdout.write(f"{evaluation.version}: {evaluation.status}")
        skipped = len(selected) - len(queued)
        self.stdout.write(
            f"{len(queued)} evaluation(s) queued or decided"
            + (
                f"; {skipped} version(s) not evaluable (not ready and compatible)"
                if skipped
                else ""
            )
        )
