"""The Celery app of tests/celery/, for real ``celery worker`` and ``celery beat``
processes (``celery -A _app ...``, with this folder on the path).

Its broker is kombu's filesystem transport in ``$PGSOLO_CELERY_DIR/broker``, so no server
but PostgreSQL is needed, and its results go to files in ``$PGSOLO_CELERY_DIR/results``.
The database is ``$PGSOLO_DSN``; the tasks write their runs to the table
``$PGSOLO_CELERY_TABLE``. A worker says it is ready with a file ``ready-<pid>``; a beat
sends ``tick`` every second when ``$PGSOLO_CELERY_BEAT`` is set."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import psycopg
from celery.signals import worker_ready

from celery import Celery
from pgsolo.celery import Singleton

folder = Path(os.environ["PGSOLO_CELERY_DIR"])
table = os.environ["PGSOLO_CELERY_TABLE"]
dsn = os.environ["PGSOLO_DSN"]
broker = folder / "broker"

app = Celery("pgsolo-tests")
app.conf.update(
    broker_url="filesystem://",
    broker_transport_options={
        "data_folder_in": str(broker),
        "data_folder_out": str(broker),
        "control_folder": str(folder / "control"),  # kombu's default is ./control
        "polling_interval": 0.05,
    },
    result_backend=f"file://{folder / 'results'}",
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    pgsolo_dsn=dsn,
)
if os.environ.get("PGSOLO_CELERY_BEAT"):
    app.conf.beat_schedule = {"tick": {"task": "tick", "schedule": 1.0}}


@worker_ready.connect
def _ready(**_: Any) -> None:
    (folder / f"ready-{os.getpid()}").touch()


def _note(task_id: str, what: str, retries: int = 0) -> None:
    """A run's start (``what`` = its tenant) or end, with this worker's pid."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {table} (task_id, what, pid, retries) VALUES (%s, %s, %s, %s)",
            (task_id, what, os.getpid(), retries),
        )


@app.task(
    bind=True, base=Singleton, unique_on=["tenant"], acks_late=True, name="export", shared=False
)
def export(self: Singleton, tenant: int, seconds: float) -> str:
    _note(self.request.id, f"start {tenant}")
    time.sleep(seconds)
    _note(self.request.id, f"end {tenant}")
    return f"exported {tenant}"


@app.task(bind=True, base=Singleton, unique_on=[], name="retried", shared=False)
def retried(self: Singleton) -> str:
    _note(self.request.id, "ran", self.request.retries)
    if self.request.retries == 0:
        # throw=False: the run goes on holding its lock after asking for the retry, so a
        # retry sent at once would reach the other worker while the lock is held.
        self.retry(countdown=0, throw=False)
        time.sleep(1.0)
        return "first"
    return "retried"


@app.task(name="tick", shared=False)
def tick() -> None:
    """Sent by the beats; no worker runs in the beat test: the broker's files count."""
