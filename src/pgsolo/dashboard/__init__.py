"""``pgsolo dashboard``: every advisory lock, job and operation of a database in a
browser, with the ``pgsolo[dashboard]`` extra (Starlette, uvicorn, Jinja2).

:func:`create_app` is an ASGI app: ``pgsolo dashboard`` serves it, and a Starlette or
FastAPI app mounts it (``Mount("/pgsolo", create_app(dsn))``). Its pages are rendered on
the server and refresh themselves (a small script of its own; a ``<meta>`` refresh
without scripts): ``/locks``, ``/jobs``, ``/operations``, ``/doctor``, each with its JSON
under ``/api/``, and ``/metrics`` for Prometheus. It only reads, unless started to allow
terminating a lock holder, which then needs a token (docs/dashboard.md).

The same pages mount in a Django project as a URL include, :mod:`pgsolo.django.dashboard`,
which needs Jinja2 and Django only: :func:`create_app` (and Starlette with it) is
imported on first use (PEP 562).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> object:
    if name == "create_app":
        from .app import create_app  # noqa: PLC0415 - Starlette's, only when asked for

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
