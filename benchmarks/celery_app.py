"""The Celery app of item 11 (``scenario_celery.py``), in the benchmark's process and in
the real ``celery worker`` and ``celery beat`` processes it starts (``celery -A
benchmarks.celery_app:app``, configured by the environment: :data:`FOLDER_ENV`,
:data:`TICK_ENV` and ``PGSOLO_DSN``).

Its broker is kombu's filesystem transport in ``<folder>/broker``, so no server but
PostgreSQL is needed, and a message's file name starts with the monotonic clock of the
moment it was sent (in ms; one clock for every process of the machine). Its results go to
files in ``<folder>/results``. Three tasks run the same body, nothing: ``plain``;
``singleton`` (``pgsolo.celery.Singleton``, one key for every run); and ``recipe``, the
article's recipe written by hand in the task: a connection of its own,
``pg_try_advisory_lock``, the body, ``pg_advisory_unlock``. With a tick, the beat sends
``tick`` that often.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psycopg

from celery import Celery  # type: ignore[import-untyped]
from pgsolo.celery import Singleton

FOLDER_ENV = "PGSOLO_BENCH_CELERY_DIR"
TICK_ENV = "PGSOLO_BENCH_CELERY_TICK"
NAME = "pgsolo-bench"  # the beats' leader name is celery-beat:<this>
POLLING_INTERVAL_S = 0.05  # how often an idle worker looks for a new message
RECIPE_KEY = (42, 1011)


def noop() -> None:
    """The body of every task: nothing, so what is timed is the task's own cost."""


def make_app(folder: Path, dsn: str, tick: float | None = None, *, outbox: bool = False) -> Any:
    """The app on its folder's broker and results, its lock on ``dsn``; the beat sends
    ``tick`` every ``tick`` seconds. With ``outbox``, what it sends goes to
    ``<folder>/outbox``, for the caller to move into the broker (:func:`post`)."""
    app = Celery(NAME)
    app.conf.update(
        broker_url="filesystem://",
        broker_transport_options={
            "data_folder_in": str(folder / "broker"),
            "data_folder_out": str(folder / ("outbox" if outbox else "broker")),
            "control_folder": str(folder / "control"),  # kombu's default is ./control
            "polling_interval": POLLING_INTERVAL_S,
        },
        result_backend=f"file://{folder / 'results'}",
        worker_prefetch_multiplier=1,
        broker_connection_retry_on_startup=True,
        pgsolo_database_url=dsn,
    )
    if tick is not None:
        app.conf.beat_schedule = {"tick": {"task": "tick", "schedule": tick}}

    def recipe() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute("SELECT pg_try_advisory_lock(%s, %s)", RECIPE_KEY).fetchone()
            if not (row and row[0]):  # busy: the benchmark would time the wrong path
                raise RuntimeError(f"the recipe's lock {RECIPE_KEY} is busy")
            try:
                noop()
            finally:
                conn.execute("SELECT pg_advisory_unlock(%s, %s)", RECIPE_KEY)

    app.task(name="plain", shared=False)(noop)
    app.task(name="recipe", shared=False)(recipe)
    app.task(name="singleton", base=Singleton, unique_on=[], shared=False)(noop)
    app.task(name="tick", shared=False)(noop)  # sent by the beats; no worker runs it
    return app


def post(folder: Path) -> None:
    """Move the messages of ``<folder>/outbox`` into the broker, each whole: kombu's
    reader takes a file as soon as it is listed, even one still empty, and an empty
    message stops the worker (``Unrecoverable error: JSONDecodeError``)."""
    for message in sorted((folder / "outbox").glob("*.msg")):
        message.rename(folder / "broker" / message.name)


if FOLDER_ENV in os.environ:  # a worker's or a beat's process
    app = make_app(
        Path(os.environ[FOLDER_ENV]),
        os.environ["PGSOLO_DSN"],
        float(os.environ[TICK_ENV]) if os.environ.get(TICK_ENV) else None,
    )
