"""Who may terminate a backend from the dashboard: the holder of the token it was started
with, from a form the dashboard itself served, on the dashboard's own origin.

Three checks, each refusing on its own: the token (a header for scripts, a form field
for people), the CSRF token (derived from a secret of this app and the pid, so a form
served for one backend cannot end another, and a page of another site cannot forge it),
and the request's ``Origin`` (a browser sends it with every POST; another site's is
refused even with the right tokens). Each comparison takes constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from urllib.parse import urlsplit

from starlette.requests import Request

__all__ = ["CSRF_FIELD", "TOKEN_FIELD", "TOKEN_HEADER", "Guard", "new_token"]

# Where a request carries the token: names, not secrets.
TOKEN_HEADER = "x-pgsolo-token"  # noqa: S105
TOKEN_FIELD = "token"  # noqa: S105
CSRF_FIELD = "csrf"


def new_token() -> str:
    """A token to start a dashboard with (``pgsolo dashboard`` prints it)."""
    return secrets.token_urlsafe(24)


class Guard:
    """The checks of one app: its ``token`` and a secret of its own for CSRF tokens."""

    def __init__(self, token: str) -> None:
        self._token = token.encode("utf-8")
        self._secret = secrets.token_bytes(32)

    def csrf_for(self, pid: int) -> str:
        """The CSRF token of the confirmation form for backend ``pid``."""
        return hmac.new(self._secret, f"terminate:{pid}".encode(), hashlib.sha256).hexdigest()

    def refusal(self, request: Request, pid: int, form: dict[str, str]) -> str | None:
        """Why the terminate request for ``pid`` is refused, or None when it may go on."""
        if not _same_origin(request):
            return "the request comes from another origin"
        given_csrf = form.get(CSRF_FIELD, "")
        if not hmac.compare_digest(given_csrf.encode("utf-8"), self.csrf_for(pid).encode()):
            return "the confirmation form's CSRF token is missing or wrong"
        given = request.headers.get(TOKEN_HEADER) or form.get(TOKEN_FIELD, "")
        if not hmac.compare_digest(given.encode("utf-8"), self._token):
            return "the token is missing or wrong"
        return None


def _same_origin(request: Request) -> bool:
    """Whether the request's ``Origin`` (or, without one, ``Referer``) is this server's
    own scheme, host and port; a request that sends neither (a script) passes, the
    tokens still decide."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if origin is None:
        return True
    if origin == "null":  # a sandboxed frame or a redirect hides it: never ours
        return False
    given = urlsplit(origin)
    return (given.scheme, given.netloc) == (request.url.scheme, request.url.netloc)
