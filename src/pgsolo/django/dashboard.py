"""The dashboard in a Django project, as a URL include behind the project's own login::

    path("pgsolo/", include("pgsolo.django.dashboard"))

The pages, their JSON, ``/metrics`` and the two static files of :mod:`pgsolo.dashboard`,
rendered by the same templates (:mod:`pgsolo.dashboard.pages`), each view for staff
only (``staff_member_required``: anyone else goes to the admin's login page). Read-only:
no terminate route. It reads through Django's connection of the alias in the setting
``PGSOLO_DASHBOARD_DATABASE`` (default ``"default"``), and gives it back as it found it:
the reads run in an atomic block rolled back after them (a savepoint inside the
request's transaction, with ``ATOMIC_REQUESTS``), so that nothing they set stays and a
read that fails (pgsolo's tables missing) leaves that transaction usable. The keys are
named as ``pgsolo locks --registry/--name/--semaphore`` would by the settings
``PGSOLO_DASHBOARD_REGISTRY`` (a TOML file's path), ``PGSOLO_DASHBOARD_NAMES`` (a list)
and ``PGSOLO_DASHBOARD_SEMAPHORES`` (``{"exports": 3}``). Needs Django and Jinja2
(``pgsolo[dashboard]``), not Starlette.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from typing import TYPE_CHECKING, Any

from django import urls
from django.conf import settings
from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.views.decorators.http import require_safe

from ..dashboard import reads
from ..dashboard.exposition import CONTENT_TYPE, exposition
from ..dashboard.pages import (
    HEADERS,
    PAGES,
    REFRESH_SECONDS,
    STATIC,
    Reader,
    ReadFailed,
    environment,
    failure_document,
    read_page,
)
from ..dashboard.reads import Naming
from ..drivers import django_connection
from ..drivers.conninfo import make_dsn
from ..keys import Registry

if TYPE_CHECKING:
    from ..drivers.kinds import SyncConnectionLike

__all__ = ["app_name", "urlpatterns"]

Handler = Callable[..., HttpResponse]

DATABASE_SETTING = "PGSOLO_DASHBOARD_DATABASE"
# What names the keys, as pgsolo locks's --registry (a TOML file's path), --name (a list)
# and --semaphore (a dict of names to limits).
REGISTRY_SETTING = "PGSOLO_DASHBOARD_REGISTRY"
NAMES_SETTING = "PGSOLO_DASHBOARD_NAMES"
SEMAPHORES_SETTING = "PGSOLO_DASHBOARD_SEMAPHORES"

_env = environment(refresh=REFRESH_SECONDS, allow_terminate=False)


def _alias() -> str:
    alias: str = getattr(settings, DATABASE_SETTING, "default")
    return alias


@contextmanager
def _connection() -> Iterator[SyncConnectionLike]:
    """Django's connection of the dashboard's alias, left as it was found: the reads run
    in an atomic block that is always rolled back (a transaction of their own, or a
    savepoint inside the request's, with ``ATOMIC_REQUESTS``). They changed nothing that
    may stay (the doctor's proxy check stamps its session with a setting of pgsolo's),
    and a read that failed (its error or notice shown) leaves the request's transaction
    usable."""
    alias = _alias()
    with transaction.atomic(using=alias):
        try:
            yield django_connection(alias)
        finally:
            transaction.set_rollback(True, using=alias)


def _naming() -> Naming:
    """The names of the settings, checked at each request (a registry file may change):
    a bad one is the project's configuration error, not the database's."""
    path = getattr(settings, REGISTRY_SETTING, None)
    try:
        registry = Registry.from_toml(path) if path is not None else None
        return Naming.of(
            registry,
            getattr(settings, NAMES_SETTING, ()),
            getattr(settings, SEMAPHORES_SETTING, None),
        )
    except (OSError, ValueError) as exc:  # pgsolo's InvalidArgumentError is a ValueError
        raise ImproperlyConfigured(f"pgsolo's dashboard: {exc}") from exc


def _reader() -> Reader:
    """The reads through :func:`_connection`, whose failures show none of the
    database's passwords in Django's settings."""
    database = settings.DATABASES.get(_alias(), {})
    secrets = make_dsn(
        password=database.get("PASSWORD") or None,
        sslpassword=database.get("OPTIONS", {}).get("sslpassword"),
    )
    return Reader(_connection, secrets)


def _guarded(view: Handler) -> Handler:
    """``view`` for active staff users only (others are sent to the admin's login), for
    GET and HEAD only, with the dashboard's headers on every response."""
    checked: Handler = staff_member_required(require_safe(view))

    @functools.wraps(view)
    def with_headers(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
        response = checked(request, *args, **kwargs)
        for name, value in HEADERS.items():
            response[name] = value
        return response

    return with_headers


def _url_for(request: HttpRequest) -> Callable[..., str]:
    """The templates' ``url_for(name, **params)``: Django's ``reverse`` in the namespace
    the request came through (``pgsolo_dashboard``, or the instance the project named)."""
    namespace = request.resolver_match.namespace

    def url_for(name: str, /, **params: Any) -> str:
        url: str = urls.reverse(f"{namespace}:{name}", kwargs=params)
        return url

    return url_for


def _render(
    request: HttpRequest, name: str, context: dict[str, Any], status: int = 200
) -> HttpResponse:
    html = _env.get_template(name).render(page=name, url_for=_url_for(request), **context)
    return HttpResponse(html, status=status)


def _home(request: HttpRequest) -> HttpResponse:
    return HttpResponseRedirect(_url_for(request)("locks"), status=303)


def _page(name: str) -> Handler:
    def page(request: HttpRequest) -> HttpResponse:
        try:
            view = _reader()(read_page, name, request.GET, _naming())
        except ReadFailed as failed:
            return _render(request, "error.html", {"failed": failed}, failed.status)
        return _render(request, f"{name}.html", {"view": view})

    return page


def _api(name: str) -> Handler:
    def api(request: HttpRequest) -> HttpResponse:
        try:
            view = _reader()(read_page, name, request.GET, _naming())
        except ReadFailed as failed:
            return JsonResponse(failure_document(failed), status=failed.status)
        return JsonResponse(view.document())

    return api


def _metrics(request: HttpRequest) -> HttpResponse:
    try:
        view = _reader()(reads.read_locks, _naming())
    except ReadFailed as failed:
        return JsonResponse(failure_document(failed), status=failed.status)
    return HttpResponse(exposition(view.locks), content_type=CONTENT_TYPE)


def _static(request: HttpRequest, path: str) -> HttpResponse:
    """A file of the package's ``static/``, read from the package itself: no
    ``collectstatic`` needed."""
    if path not in STATIC:
        raise Http404(path)
    body = resources.files("pgsolo.dashboard").joinpath("static", path).read_bytes()
    return HttpResponse(body, content_type=STATIC[path])


app_name = "pgsolo_dashboard"

urlpatterns = [
    urls.path("", _guarded(_home), name="home"),
    *(urls.path(page, _guarded(_page(page)), name=page) for page in PAGES),
    *(urls.path(f"api/{page}", _guarded(_api(page)), name=f"api_{page}") for page in PAGES),
    urls.path("metrics", _guarded(_metrics), name="metrics"),
    urls.path("static/<str:path>", _guarded(_static), name="static"),
]
