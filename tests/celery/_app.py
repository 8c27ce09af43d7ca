"""The Celery app of tests/celery/, for real ``celery worker`` and ``celery beat``
processes (``celery -A _app ...``, with this folder on the path).

Its broker is kombu's filesystem transport in ``$PGSOLO_CELERY_DIR/broker``, so no server
but PostgreSQL is needed (each message delivered is kept in ``processed``; each message
sent appears there whole, :class:`WholeMessages`), and its results
go to files in ``$PGSOLO_CELERY_DIR/results``. The database is ``$PGSOLO_DSN``; the tasks
write their runs to the table ``$PGSOLO_CELERY_TABLE``. A worker says it is ready with a
file ``ready-<pid>``; a beat sends the task ``$PGSOLO_CELERY_BEAT`` every half second, with
the table's name as its argument. The app's name, and so the leadership its beats campaign
for, is ``$PGSOLO_CELERY_APP`` (default ``pgsolo-tests``)."""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
from celery.signals import worker_ready
from kombu.transport import TRANSPORT_ALIASES, filesystem
from kombu.utils.json import dumps

from celery import Celery
from pgsolo.celery import Singleton

folder = Path(os.environ["PGSOLO_CELERY_DIR"])
table = os.environ["PGSOLO_CELERY_TABLE"]
dsn = os.environ["PGSOLO_DSN"]
broker = folder / "broker"


class _WholeMessagesChannel(filesystem.Channel):  # type: ignore[misc]
    def _put(self, queue: str, payload: Any, **kwargs: Any) -> None:
        # kombu's own name for a message file (its readers sort by it), written under a
        # name its readers skip (no "<queue>.msg" after the first dot) and then renamed,
        # which is atomic. Nothing of this module's globals: kombu caches the transport
        # class of the first app a process imported.
        name = f"{round(time.monotonic() * 1000)}_{uuid.uuid4()}.{queue}.msg"
        out = Path(self.data_folder_out)
        staged = out / f".{name}.part"
        staged.write_bytes(dumps(payload).encode())
        os.replace(staged, out / name)


class WholeMessages(filesystem.Transport):  # type: ignore[misc]
    """kombu's filesystem transport, whose messages appear whole: kombu writes a message
    file in place, and a worker polling meanwhile can read it still empty, which ends the
    worker (a JSONDecodeError), and a test then waits for a result that never comes."""

    Channel = _WholeMessagesChannel


# kombu calls an alias that is callable for the transport class it names.
TRANSPORT_ALIASES["whole-files"] = lambda: WholeMessages

app = Celery(os.environ.get("PGSOLO_CELERY_APP", "pgsolo-tests"))
app.conf.update(
    broker_url="whole-files://",
    broker_transport_options={
        "data_folder_in": str(broker),
        "data_folder_out": str(broker),
        "control_folder": str(folder / "control"),  # kombu's default is ./control
        "polling_interval": 0.05,
        "store_processed": True,
        "processed_folder": str(folder / "processed"),
    },
    result_backend=f"file://{folder / 'results'}",
    worker_prefetch_multiplier=1,
    worker_lost_wait=1.0,  # how long a prefork worker waits to call a dead child's task lost
    broker_connection_retry_on_startup=True,
    pgsolo_database_url=dsn,
)
if beat := os.environ.get("PGSOLO_CELERY_BEAT"):
    app.conf.beat_schedule = {beat: {"task": beat, "schedule": 0.5, "args": (table,)}}


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


@app.task(bind=True, base=Singleton, unique_on=["tenant"], name="hold", shared=False)
def hold(self: Singleton, tenant: int, seconds: float) -> str:
    """``export`` without acks_late: acknowledged as a worker takes it."""
    _note(self.request.id, f"start {tenant}")
    time.sleep(seconds)
    _note(self.request.id, f"end {tenant}")
    return f"held {tenant}"


@app.task(
    bind=True,
    base=Singleton,
    unique_on=["tenant"],
    acks_late=True,
    reject_on_worker_lost=True,
    name="requeued",
    shared=False,
)
def requeued(self: Singleton, tenant: int, seconds: float) -> str:
    """``export``, requeued when the process that runs it dies."""
    _note(self.request.id, f"start {tenant}")
    time.sleep(seconds)
    _note(self.request.id, f"end {tenant}")
    return f"requeued {tenant}"


@app.task(bind=True, base=Singleton, once_per_occurrence=True, name="every", shared=False)
def every(self: Singleton, run: str) -> None:
    """Sent by the beats (``run``: the test's table, so that its key is the test's own):
    notes the scheduled time it runs for."""
    _note(self.request.id, self.request.headers["pgsolo_occurrence"])
    time.sleep(0.1)


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
def tick(run: str) -> None:
    """Sent by the beats; no worker runs in the beat test: the broker's files count."""
