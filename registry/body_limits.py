"""The upload routes' own body limits, checked in front of Django (platform_site/body_limits.py):
a version upload may carry the adapter limit plus its config and eval set, an eval set
upload the eval set limit; each file part is held to its own limit as it arrives (the
same table the upload handlers enforce, uploads.py), and a refusal names the part."""

from django.conf import settings

from platform_site.body_limits import RouteLimit, described_size
from platform_site.errors import ApiError

from .errors import UploadTooLarge
from .uploads import EVAL_SET_FIELD, MULTIPART_OVERHEAD, eval_set_limits, limits, too_large

UPLOAD_ROUTE = "registry-versions"
EVAL_SET_ROUTE = "registry-eval-set"


def _upload_limit() -> int:
    return sum(limits().values()) + MULTIPART_OVERHEAD


def _eval_set_limit() -> int:
    return settings.EVAL_MAX_BYTES + MULTIPART_OVERHEAD


def _upload_too_large(size: int | None, limit: int) -> ApiError:
    return UploadTooLarge(
        f"The upload {described_size(size, limit)}; this deployment accepts adapters up to "
        f"{settings.MAX_ADAPTER_BYTES} bytes of weights ({limit} bytes with the config and "
        f"an eval set of up to {settings.EVAL_MAX_BYTES} bytes)."
    )


def _eval_set_too_large(size: int | None, limit: int) -> ApiError:
    """Its one part is the eval set: a body too large is that part's fault."""
    return UploadTooLarge(
        f"The upload {described_size(size, limit)}; eval sets may hold up to "
        f"{settings.EVAL_MAX_BYTES} bytes (LORAPLEX_EVAL_MAX_BYTES).",
        param=EVAL_SET_FIELD,
    )


ROUTE_LIMITS = {
    UPLOAD_ROUTE: RouteLimit(
        "POST", _upload_limit, _upload_too_large, parts=limits, refuse_part=too_large
    ),
    EVAL_SET_ROUTE: RouteLimit(
        "PUT", _eval_set_limit, _eval_set_too_large, parts=eval_set_limits, refuse_part=too_large
    ),
}
