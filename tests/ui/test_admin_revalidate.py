"""The admin's *Re-validate* action queues a validation that a real worker runs: a version
rejected by a fault (object storage down, say) becomes ready again without a new upload."""

from registry.models import AdapterVersion
from tests.ui.conftest import make_version, page
from tests.waiting import wait_for


def test_revalidating_a_version_rejected_by_a_fault_makes_a_worker_validate_it_again(
    client, django_user_model, adapter, good_adapter_dir, live_worker
):
    version = make_version(adapter, good_adapter_dir)
    fault = [{"name": "storage", "passed": False, "level": "error", "message": "storage down"}]
    AdapterVersion.objects.filter(pk=version.pk).update(
        status=AdapterVersion.REJECTED, infra_failure=True, report=fault, validated_at=None
    )
    root = django_user_model.objects.create_superuser("root", "root@example.com", "pw")
    client.force_login(root)

    response = client.post(
        "/admin/registry/adapterversion/",
        {"action": "revalidate", "_selected_action": [version.pk]},
        follow=True,
    )

    assert "Queued validation of 1 version(s)." in page(response)
    validated = wait_for(
        lambda: AdapterVersion.objects.filter(pk=version.pk, validated_at__isnull=False).first(),
        what="the worker to validate the version again",
    )
    assert validated.status == AdapterVersion.READY and validated.infra_failure is False
    assert validated.attempts == 1 and all(check["passed"] for check in validated.report)
