"""One replica of an app that runs APScheduler 3 with pgsolo's OnceExecutor, as a process of
its own: ``python _replica.py DSN TABLE START SECONDS WAIT SLOW``.

Its job runs every second from START (an ISO time, the same in every replica), writes a
row (occurrence, pid) to TABLE in the occurrence's own transaction, and notes each attempt
in TABLE_attempts at once (so a test sees who is running what). The occurrence whose key
ends with SLOW runs for a few seconds, long enough to be killed in. At SIGTERM, or after
SECONDS, the scheduler shuts down and the replica prints what its listeners saw, as JSON."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from datetime import datetime

import psycopg
from apscheduler.events import EVENT_JOB_ERROR, EVENT_JOB_EXECUTED
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.interval import IntervalTrigger

import pgsolo.apscheduler

dsn, table, start, seconds, wait, slow = sys.argv[1:]


def tick() -> None:
    occurrence = pgsolo.apscheduler.occurrence()
    with psycopg.connect(dsn, autocommit=True) as notes:
        notes.execute(
            f"INSERT INTO {table}_attempts VALUES (%s, %s)", (occurrence.op_key, os.getpid())
        )
    occurrence.conn.execute(
        f"INSERT INTO {table} VALUES (%s, %s)", (occurrence.op_key, os.getpid())
    )
    if slow and occurrence.op_key.endswith(slow):
        time.sleep(3)


seen: dict[str, list[str]] = {"executed": [], "skipped": [], "error": []}


def listen(event: object) -> None:
    kind = {
        EVENT_JOB_EXECUTED: "executed",
        EVENT_JOB_ERROR: "error",
        pgsolo.apscheduler.EVENT_OCCURRENCE_SKIPPED: "skipped",
    }[event.code]  # type: ignore[attr-defined]
    seen[kind].append(event.scheduled_run_time.isoformat())  # type: ignore[attr-defined]


stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
executor = pgsolo.apscheduler.OnceExecutor(dsn, wait=float(wait) if wait else None)
scheduler = BackgroundScheduler(executors={"default": executor}, timezone="UTC")
scheduler.add_listener(
    listen,
    EVENT_JOB_EXECUTED | EVENT_JOB_ERROR | pgsolo.apscheduler.EVENT_OCCURRENCE_SKIPPED,
)
trigger = IntervalTrigger(seconds=1, start_date=datetime.fromisoformat(start))
# A slow occurrence keeps one instance busy: the next ticks must still run somewhere.
scheduler.add_job(tick, trigger, id="tick", max_instances=5, misfire_grace_time=10)
scheduler.start()
stop.wait(float(seconds))
scheduler.shutdown(wait=True)
print(json.dumps(seen), flush=True)
