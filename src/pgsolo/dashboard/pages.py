"""The dashboard's pages without a web framework: what each page reads, the Jinja2
environment that renders them, what a failed read shows, and the headers of every
response. Its two hosts route requests to them: the ASGI app (:mod:`.app`, Starlette)
and the Django URL include (:mod:`pgsolo.django.dashboard`), so that both serve the
same HTML and JSON; importing this module needs Jinja2 alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Concatenate, ParamSpec, TypeAlias, TypeVar

import jinja2

from ..cli.exit_codes import EXIT_FAILED, EXIT_UNAVAILABLE, EXIT_USAGE
from ..cli.locks import WIDE_COLUMNS, lock_line
from ..cli.output import error_document
from ..drivers import driver_errors, is_unavailable
from ..drivers.conninfo import redact_dsn, scrub_secrets
from ..errors import DatabaseUnavailableError, InvalidArgumentError, PgsoloError
from ..monitor import AdvisoryLock, format_seconds
from . import reads
from .reads import Connect, DoctorView, JobsView, LocksView, Naming, OperationsView

__all__ = [
    "HEADERS",
    "PAGES",
    "REFRESH_SECONDS",
    "STATIC",
    "ReadFailed",
    "Reader",
    "View",
    "environment",
    "failure_document",
    "read_page",
]

P = ParamSpec("P")
T = TypeVar("T")

PAGES = ("locks", "jobs", "operations", "doctor")  # each at /NAME, its JSON at /api/NAME

REFRESH_SECONDS = 5.0

# Every response: never framed by another site (the terminate form must not be clicked
# through an overlay), no script or style but the dashboard's own, nothing cached.
HEADERS = {
    "content-security-policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "cache-control": "no-store",
}

# The files of static/, each with its content type: nothing else is served from there.
STATIC = {
    "dashboard.css": "text/css; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
}

View: TypeAlias = LocksView | JobsView | OperationsView | DoctorView

_READS: dict[str, Callable[[Connect], View]] = {
    "operations": reads.read_operations,
    "doctor": reads.read_doctor,
}


def read_page(
    connect: Connect, page: str, query: Mapping[str, str], naming: Naming | None = None
) -> View:
    """What ``page`` (one of :data:`PAGES`) shows, and its JSON; the request's ``query``
    filters the jobs page (``job``, ``outcome``), ``naming`` names the locks page's keys."""
    if page == "jobs":
        return reads.read_jobs(connect, query.get("job") or None, query.get("outcome") or None)
    if page == "locks":
        return reads.read_locks(connect, naming or Naming())
    return _READS[page](connect)


class ReadFailed(Exception):
    """A read the database refused or could not answer, its message scrubbed; ``status``
    is the response's: 400 for the request's own argument, 503 for a database that did
    not answer, 502 for one that refused the read (what ``FAILURES`` says of each)."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status

    @property
    def heading(self) -> str:
        return FAILURES[self.status][2]


# Each failure's status: its exit code and error.code in the JSON, and the page's heading.
FAILURES: dict[int, tuple[int, str, str]] = {
    400: (EXIT_USAGE, "usage-error", "The request is not one the dashboard takes"),
    502: (EXIT_FAILED, "database-error", "The database refused the read"),
    503: (EXIT_UNAVAILABLE, "database-unavailable", "The database did not answer"),
}


@dataclass(frozen=True, slots=True)
class Reader:
    """Where the pages read (``connect``), and the connection string whose secrets no
    failure may show (``dsn``: the app's, or one made of Django's settings)."""

    connect: Connect
    dsn: str

    def __call__(
        self, read: Callable[Concatenate[Connect, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``read(connect, ...)``; a database's refusal or absence as :class:`ReadFailed`,
        never a traceback or a secret."""
        failures: tuple[type[Exception], ...] = (PgsoloError, *driver_errors())
        try:
            return read(self.connect, *args, **kwargs)
        except failures as exc:
            # Where it connects, said without the connection string (not even redacted).
            shown = redact_dsn(self.dsn)
            message = scrub_secrets(str(exc).strip(), self.dsn)
            message = message.replace(shown, "the database") if shown else message
            if isinstance(exc, InvalidArgumentError):
                status = 400
            elif isinstance(exc, DatabaseUnavailableError) or is_unavailable(exc):
                status = 503
            else:
                status = 502
            raise ReadFailed(message, status) from None


def failure_document(failed: ReadFailed) -> dict[str, Any]:
    """The JSON of an ``/api/`` page or ``/metrics`` whose read failed."""
    exit_code, code, _ = FAILURES[failed.status]
    return error_document("dashboard", exit_code, str(failed), code)


def environment(**globals: object) -> jinja2.Environment:
    """The templates' environment: autoescaped, strict about undefined names, with the
    helpers the pages call and the host's ``globals`` (``refresh``, ``allow_terminate``;
    ``url_for`` where the host does not put it in each page's context)."""
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("pgsolo.dashboard", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["seconds"] = format_seconds
    env.globals.update(
        cells=_cells,
        idle_in_transaction=reads.idle_in_transaction,
        holds_back_vacuum=reads.holds_back_vacuum,
        leak_suspect=reads.leak_suspect,
        is_semaphore=lambda row: isinstance(row, reads.SemaphoreRow),
        outcomes=reads.OUTCOMES,
        **globals,
    )
    return env


def _cells(lock: AdvisoryLock) -> dict[str, str]:
    """The cells of ``lock``'s row, as ``pgsolo locks --wide`` shows them."""
    return dict(zip(WIDE_COLUMNS, lock_line(lock), strict=True))
