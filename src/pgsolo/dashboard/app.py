"""The dashboard as an ASGI app (:func:`create_app`): the routes to its pages
(:mod:`.pages`) and their JSON, and the terminate route when it is allowed.

Each request opens a connection of its own, for one read, in a worker thread (the
monitor's calls are synchronous): nothing is kept between requests, so a dashboard left
open for a week holds no session, no snapshot and no lock, and a server that went away
and came back is simply read again. A failure is shown as a page (or a JSON error) that
says what went wrong with every secret of the connection string scrubbed from it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any, Concatenate, ParamSpec, TypeVar
from urllib.parse import parse_qsl

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.middleware.trustedhost import TrustedHostMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .._logging import dashboard_logger as logger
from .._types import check_seconds
from ..cli.common import Database, connection
from ..errors import InvalidArgumentError
from ..keys import Registry
from . import reads
from .exposition import CONTENT_TYPE, exposition
from .guard import CSRF_FIELD, TOKEN_FIELD, Guard
from .pages import (
    HEADERS,
    PAGES,
    REFRESH_SECONDS,
    Reader,
    ReadFailed,
    environment,
    failure_document,
    read_page,
)
from .reads import Connect, Naming

__all__ = ["MAX_REFRESH_SECONDS", "create_app"]

P = ParamSpec("P")
T = TypeVar("T")

MAX_REFRESH_SECONDS = 3600.0

_HEADERS = [(name.encode(), value.encode()) for name, value in HEADERS.items()]

Endpoint = Callable[[Request], Awaitable[Response]]


def create_app(
    dsn: str,
    *,
    allow_terminate: bool = False,
    token: str | None = None,
    refresh_seconds: float = REFRESH_SECONDS,
    connect_timeout: float | None = None,
    registry: Registry | None = None,
    names: Iterable[str] = (),
    semaphores: Mapping[str, int] | None = None,
    allowed_hosts: Sequence[str] | None = None,
) -> Starlette:
    """The dashboard of the database at ``dsn``: an ASGI app to serve (``pgsolo
    dashboard`` runs it with uvicorn) or to mount in a Starlette or FastAPI app.

    Read-only unless ``allow_terminate``, which needs ``token``: then a backend holding
    advisory locks can be ended from its confirmation page (``/terminate/PID``) by who
    knows the token. Pages refresh every ``refresh_seconds`` (from 1 to 3600).
    ``connect_timeout`` bounds each connect (default: the DSN's, the environment's, or
    pgsolo's). ``registry``, ``names`` and ``semaphores`` name the keys as
    :func:`~pgsolo.advisory_locks` takes them (``pgsolo locks``'s ``--registry``,
    ``--name`` and ``--semaphore``), besides the names pgsolo's own records give.
    ``allowed_hosts``: the host names a request may be addressed to (its ``Host``
    header; ``*.example.com`` for a domain's), any other answered 400, as Starlette's
    ``TrustedHostMiddleware`` does: without it, a page of another site whose name
    resolves to this machine (DNS rebinding) can read the dashboard. None (the default)
    lets the app that mounts it decide. Bad arguments raise
    :class:`~pgsolo.InvalidArgumentError` before anything connects; the DSN is first read
    at the first request.
    """
    refresh = check_seconds("refresh_seconds", refresh_seconds, 1, MAX_REFRESH_SECONDS)
    naming = Naming.of(registry, names, semaphores)
    if allow_terminate and not token:
        raise InvalidArgumentError(
            "allow_terminate=True needs a token= (pgsolo dashboard prints one, or reads"
            " $PGSOLO_DASHBOARD_TOKEN): who knows it may end backends"
        )
    connect: Connect = partial(
        connection, Database(dsn, "", connect_timeout), reads.APPLICATION_NAME
    )
    dashboard = _Dashboard(
        Reader(connect, dsn),
        naming,
        Jinja2Templates(env=environment(refresh=refresh, allow_terminate=allow_terminate)),
        Guard(token) if allow_terminate and token else None,
    )
    routes = [
        Route("/", dashboard.home, name="home"),
        *(Route(f"/{page}", dashboard.page(page), name=page) for page in PAGES),
        *(Route(f"/api/{page}", dashboard.api(page), name=f"api_{page}") for page in PAGES),
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
        exception_handlers={ReadFailed: dashboard.read_failed},
    )
    app.add_middleware(_SecurityHeaders)
    if allowed_hosts is not None:
        if isinstance(allowed_hosts, str) or not all(isinstance(h, str) for h in allowed_hosts):
            raise InvalidArgumentError(
                f"allowed_hosts is a list of host names, got {allowed_hosts!r}"
            )
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=list(allowed_hosts))
    return app


class _Dashboard:
    """The handlers of one app: where it reads, how it renders, and who may terminate
    (None: nobody)."""

    def __init__(
        self, reader: Reader, naming: Naming, templates: Jinja2Templates, guard: Guard | None
    ) -> None:
        self.reader = reader
        self.naming = naming
        self.templates = templates
        self.guard = guard

    async def read(
        self, read: Callable[Concatenate[Connect, P], T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """The read in a worker thread (the monitor's calls are synchronous); a failure
        raises :class:`~.pages.ReadFailed`, which :meth:`read_failed` shows."""
        return await run_in_threadpool(lambda: self.reader(read, *args, **kwargs))

    def render(
        self, request: Request, name: str, context: dict[str, Any], status: int = 200
    ) -> Response:
        return self.templates.TemplateResponse(
            request, name, {"page": name, **context}, status_code=status
        )

    async def home(self, request: Request) -> Response:
        return RedirectResponse(request.url_for("locks"), status_code=303)

    def page(self, name: str) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            query = request.query_params
            view = await self.read(read_page, name, query, self.naming)
            return self.render(request, f"{name}.html", {"view": view})

        return endpoint

    def api(self, name: str) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            query = request.query_params
            view = await self.read(read_page, name, query, self.naming)
            return JSONResponse(view.document())

        return endpoint

    async def metrics(self, request: Request) -> Response:
        view = await self.read(reads.read_locks, self.naming)
        return PlainTextResponse(exposition(view.locks), media_type=CONTENT_TYPE)

    def _refused(
        self, request: Request, pid: int, client: str, refusal: str, status: int
    ) -> Response:
        """A terminate refused (``status``), logged as every refusal is."""
        logger.warning(
            "pgsolo dashboard: refused to terminate backend %d, asked from %s: %s",
            pid,
            client,
            refusal,
        )
        context = {"pid": pid, "refusal": refusal, "ended": False, "held": []}
        return self.render(request, "terminated.html", context, status=status)

    async def terminate(self, request: Request) -> Response:
        pid: int = request.path_params["pid"]
        if self.guard is None:  # the route exists only with a guard
            raise HTTPException(404)
        if request.method == "GET":
            held = await self.read(reads.read_session, self.naming, pid)
            csrf = self.guard.csrf_for(pid)
            context = {"pid": pid, "held": held, "csrf": csrf, "csrf_field": CSRF_FIELD}
            return self.render(request, "terminate.html", {**context, "token_field": TOKEN_FIELD})
        form = await _form(request)
        client = request.client.host if request.client else "?"
        if (refusal := self.guard.refusal(request, pid, form)) is not None:
            return self._refused(request, pid, client, refusal, 403)
        if not await self.read(reads.read_session, self.naming, pid):
            refusal = "it holds and waits for no advisory lock (pgsolo terminate --force can)"
            return self._refused(request, pid, client, refusal, 409)
        ended, held = await self.read(reads.terminate, self.naming, pid)
        logger.warning(
            "pgsolo dashboard: terminated backend %d (%s), asked from %s: %s",
            pid,
            "ended" if ended else "not ended yet",
            client,
            ", ".join(lock.name or lock.key.text for lock in held) or "no advisory lock",
        )
        context = {"pid": pid, "refusal": None, "ended": ended, "held": held}
        return self.render(request, "terminated.html", context)

    async def read_failed(self, request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ReadFailed)  # noqa: S101 - the only class it handles
        path = request.url.path
        if "/api/" in path or path.endswith("/metrics"):
            return JSONResponse(failure_document(exc), status_code=exc.status)
        return self.render(request, "error.html", {"failed": exc}, status=exc.status)


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
    """Adds :data:`~.pages.HEADERS` to every response of the app."""

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
