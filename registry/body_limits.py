"""The upload routes' own body limits, checked in front of Django (platform_site/body_limits.py):
a version upload may carry the adapter limit plus its config and eval set, an eval set
upload the eval set limit."""

from django.conf import settings

from platform_site.body_limits import RouteLimit, described_size
from platform_site.errors import ApiError

from .errors import UploadTooLarge
from .uploads import MULTIPART_OVERHEAD, limits

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
    return UploadTooLarge(
        f"The upload {described_size(size, limit)}; eval sets may hold up to "
        f"{settings.EVAL_MAX_BYTES} bytes (LORAPLEX_EVAL_MAX_BYTES)."
    )


ROUTE_LIMITS = {
    UPLOAD_ROUTE: RouteLimit("POST", _upload_limit, _upload_too_large),
    EVAL_SET_ROUTE: RouteLimit("PUT", _eval_set_limit, _eval_set_too_large),
}
