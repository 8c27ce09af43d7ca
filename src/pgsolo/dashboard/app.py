"""The dashboard as an ASGI app (:func:`create_app`): its routes, its pages and their JSON.

Each request opens a connection of its own, for one read, in a worker thread (the
monitor's calls are synchronous): nothing is kept between requests, so a dashboard left
open for a week holds no session, no snapshot and no lock, and a server that went away
and came back is simply read again. A failure is shown as a page (or a JSON error) that
says what went wrong with every secret of the connection string scrubbed from it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import parse_qsl

import jinja2
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._logging import dashboard_logger as logger
from .._types import check_seconds
from ..cli.common import Database
from ..cli.locks import WIDE_COLUMNS, lock_line
from ..cli.output import error_document
from ..drivers import driver_errors
from ..drivers.conninfo import scrub_secrets
from ..errors import InvalidArgumentError, PgsoloError
from ..monitor import AdvisoryLock, format_seconds
from . import reads
from .exposition import CONTENT_TYPE, exposition
from .guard import CSRF_FIELD, TOKEN_FIELD, Guard

__all__ = ["MAX_REFRESH_SECONDS", "create_app"]

T = TypeVar("T")

MAX_REFRESH_SECONDS = 3600.0

# Every response: never framed by another site (the terminate form must not be clicked
# through an overlay), no script or style but the dashboard's own, nothing cached.
_HEADERS = (
    (b"content-security-policy", b"default-src 'self'; frame-ancestors 'none'; form-action 'self'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
)


def create_app(
    dsn: str,
    *,
    allow_terminate: bool = False,
    token: str | None = None,
    refresh_seconds: float = 5.0,
    connect_timeout: float | None = None,
) -> Starlette:
    """The dashboard of the database at ``dsn``: an ASGI app to serve (``pgsolo
    dashboard`` runs it with uvicorn) or to mount in a Starlette or FastAPI app.

    Read-only unless ``allow_terminate``, which needs ``token``: then a backend holding
    advisory locks can be ended from its confirmation page (``/terminate/PID``) by who
    knows the token. Pages refresh every ``refresh_seconds`` (from 1 to 3600).
    ``connect_timeout`` bounds each connect (default: the DSN's, the environment's, or
    pgsolo's). Bad arguments raise :class:`~pgsolo.InvalidArgumentError` before anything
    connects; the DSN is first read at the first request.
    """
    refresh = check_seconds("refresh_seconds", refresh_seconds, 1, MAX_REFRESH_SECONDS)
    if allow_terminate and not token:
        raise InvalidArgumentError(
            "allow_terminate=True needs a token= (pgsolo dashboard prints one, or reads"
            " $PGSOLO_DASHBOARD_TOKEN): who knows it may end backends"
        )
    dashboard = _Dashboard(
        Database(dsn, "", connect_timeout), Guard(token) if allow_terminate and token else None
    )
    dashboard.templates.env.globals.update(refresh=refresh, allow_terminate=allow_terminate)
    routes = [
        Route("/", dashboard.home, name="home"),
        Route("/locks", dashboard.locks_page, name="locks"),
        Route("/jobs", dashboard.jobs_page, name="jobs"),
        Route("/operations", dashboard.operations_page, name="operations"),
        Route("/doctor", dashboard.doctor_page, name="doctor"),
        Route("/api/locks", dashboard.locks_api, name="api_locks"),
        Route("/api/jobs", dashboard.jobs_api, name="api_jobs"),
        Route("/api/operations", dashboard.operations_api, name="api_operations"),
        Route("/api/doctor", dashboard.doctor_api, name="api_doctor"),
        Route("/metrics", dashboard.metrics, name="metrics"),
        Mount("/static", StaticFiles(packages=[("pgsolo.dashboard", "static")]), name="static"),
    ]
    if allow_terminate:
        routes.append(
            Route(
                "/terminate/{pid:int}",
                dashboard.terminate,
                methods=["GET", "POST"],
                name="terminate",
            )
        )
    app = Starlette(
        routes=routes,
        exception_handlers={_ReadFailed: dashboard.read_failed},
    )
    app.add_middleware(_SecurityHeaders)
    return app


class _ReadFailed(Exception):
    """A read the database refused or could not answer, its message scrubbed."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


class _Dashboard:
    """The handlers of one app: where it reads, and who may terminate (None: nobody)."""

    def __init__(self, db: Database, guard: Guard | None) -> None:
        self.db = db
        self.guard = guard
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
        )
        self.templates = Jinja2Templates(env=env)

    async def read(self, read: Callable[..., T], *args: Any) -> T:
        """``read(self.db, *args)`` in a worker thread; a database's refusal or absence
        as :class:`_ReadFailed`, never a traceback or a secret."""
        failures: tuple[type[Exception], ...] = (PgsoloError, *driver_errors())
        try:
            return await run_in_threadpool(read, self.db, *args)
        except failures as exc:
            message = scrub_secrets(str(exc).strip(), self.db.dsn)
            status = 400 if isinstance(exc, InvalidArgumentError) else 503
            raise _ReadFailed(message, status) from None

    def page(
        self, request: Request, name: str, context: dict[str, Any], status: int = 200
    ) -> Response:
        return self.templates.TemplateResponse(
            request, name, {"page": name, **context}, status_code=status
        )

    async def home(self, request: Request) -> Response:
        return RedirectResponse(request.url_for("locks"), status_code=303)

    async def locks_page(self, request: Request) -> Response:
        return self.page(request, "locks.html", {"view": await self.read(reads.read_locks)})

    async def locks_api(self, request: Request) -> Response:
        return JSONResponse((await self.read(reads.read_locks)).document())

    async def jobs_page(self, request: Request) -> Response:
        view = await self.read(reads.read_jobs, request.query_params.get("job") or None)
        return self.page(request, "jobs.html", {"view": view})

    async def jobs_api(self, request: Request) -> Response:
        view = await self.read(reads.read_jobs, request.query_params.get("job") or None)
        return JSONResponse(view.document())

    async def operations_page(self, request: Request) -> Response:
        view = await self.read(reads.read_operations)
        return self.page(request, "operations.html", {"view": view})

    async def operations_api(self, request: Request) -> Response:
        return JSONResponse((await self.read(reads.read_operations)).document())

    async def doctor_page(self, request: Request) -> Response:
        return self.page(request, "doctor.html", {"view": await self.read(reads.read_doctor)})

    async def doctor_api(self, request: Request) -> Response:
        return JSONResponse((await self.read(reads.read_doctor)).document())

    async def metrics(self, request: Request) -> Response:
        view = await self.read(reads.read_locks)
        return PlainTextResponse(exposition(view.locks), media_type=CONTENT_TYPE)

    async def terminate(self, request: Request) -> Response:
        pid: int = request.path_params["pid"]
        if self.guard is None:  # the route exists only with a guard
            raise HTTPException(404)
        if request.method == "GET":
            held = await self.read(reads.read_session, pid)
            csrf = self.guard.csrf_for(pid)
            context = {"pid": pid, "held": held, "csrf": csrf, "csrf_field": CSRF_FIELD}
            return self.page(request, "terminate.html", {**context, "token_field": TOKEN_FIELD})
        form = await _form(request)
        client = request.client.host if request.client else "?"
        if (refusal := self.guard.refusal(request, pid, form)) is not None:
            logger.warning(
                "pgsolo dashboard: refused to terminate backend %d, asked from %s: %s",
                pid,
                client,
                refusal,
            )
            context = {"pid": pid, "refusal": refusal, "ended": False, "held": []}
            return self.page(request, "terminated.html", context, status=403)
        if not await self.read(reads.read_session, pid):
            refusal = "it holds and waits for no advisory lock (pgsolo terminate --force can)"
            context = {"pid": pid, "refusal": refusal, "ended": False, "held": []}
            return self.page(request, "terminated.html", context, status=409)
        ended, held = await self.read(reads.terminate, pid)
        logger.warning(
            "pgsolo dashboard: terminated backend %d (%s), asked from %s: %s",
            pid,
            "ended" if ended else "not ended yet",
            client,
            ", ".join(lock.name or lock.key.text for lock in held) or "no advisory lock",
        )
        context = {"pid": pid, "refusal": None, "ended": ended, "held": held}
        return self.page(request, "terminated.html", context)

    async def read_failed(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, _ReadFailed)  # noqa: S101 - the only class it handles
        path = request.url.path
        if "/api/" in path or path.endswith("/metrics"):
            doc = error_document("dashboard", 69, str(exc), "database-unavailable")
            return JSONResponse(doc, status_code=exc.status)
        return self.page(request, "error.html", {"message": str(exc)}, status=exc.status)


def _cells(lock: AdvisoryLock) -> dict[str, str]:
    """The cells of ``lock``'s row, as ``pgsolo locks --wide`` shows them."""
    return dict(zip(WIDE_COLUMNS, lock_line(lock), strict=True))


async def _form(request: Request) -> dict[str, str]:
    """A URL-encoded form's fields (the one kind the confirmation form sends; no
    multipart parser needed); anything else reads as no field at all."""
    if request.headers.get("content-type", "").split(";")[0].strip() != (
        "application/x-www-form-urlencoded"
    ):
        return {}
    body = (await request.body()).decode("utf-8", "replace")
    try:
        return dict(parse_qsl(body, max_num_fields=10))
    except ValueError:  # more fields than the form has: not the dashboard's form
        return {}


class _SecurityHeaders:
    """Adds :data:`_HEADERS` to every response of the app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_HEADERS]
            await send(message)

        await self.app(scope, receive, with_headers)
