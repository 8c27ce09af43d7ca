"""One replica of an app that runs its APScheduler 3 scheduler only while it leads, as a
process of its own: ``python _leading_replica.py DSN TABLE NAME``.

The pattern of docs/schedulers.md ("One scheduler: leadership"): the replica campaigns for
the leadership NAME in a thread (``pgsolo.campaign``); while it leads, a
``BackgroundScheduler`` runs a job every 0.2 s that writes a row (pid, term's token, time)
to TABLE. At SIGTERM the campaign stops, the scheduler shuts down and the process exits 0."""

from __future__ import annotations

import os
import signal
import sys
import threading

import psycopg
from apscheduler.schedulers.background import BackgroundScheduler

import pgsolo

dsn, table, name = sys.argv[1:]
stopping = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stopping.set())


def lead(term: pgsolo.Term) -> None:
    def tick() -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                f"INSERT INTO {table} VALUES (%s, %s, clock_timestamp())",
                (os.getpid(), term.token),
            )

    scheduler = BackgroundScheduler(timezone="UTC")
    scheduler.add_job(tick, "interval", seconds=0.2, id="tick")
    scheduler.start()
    try:
        while not stopping.is_set():
            if term.wait_lost(0.1):
                break
    finally:
        scheduler.shutdown()


candidate = threading.Thread(
    target=pgsolo.campaign, args=(dsn, name, lead), kwargs={"stop": stopping}
)
candidate.start()
stopping.wait()
candidate.join()
