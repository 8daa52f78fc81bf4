"""The API paths (/v1/ and /api/, the OpenAI-compatible and REST APIs): answered for programs,
not browsers, so their errors are JSON (platform_site/error_pages.py) and a path that lacks
its trailing slash is not redirected to the one that has it.

Django's CommonMiddleware answers a 404 whose path resolves with a slash added by a 301 to
that path: a browser then asks again, but an HTTP client either stops at the empty 301 or
follows it with a GET, so `POST /api/v1/adapters` would list the adapters instead of
creating one. On the API paths the 404 stands, and its message names the slashed path.
"""

from django.middleware import common

API_PREFIXES = ("/v1/", "/api/")


def is_api_path(path: str) -> bool:
    """/v1 and /api, and everything under them."""
    return (path + "/").startswith(API_PREFIXES)


class CommonMiddleware(common.CommonMiddleware):
    """Django's, without the trailing-slash redirect on the API paths."""

    def should_redirect_with_slash(self, request) -> bool:
        return not is_api_path(request.path_info) and super().should_redirect_with_slash(request)
