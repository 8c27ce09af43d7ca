"""What the database records and refuses: the chaos suite's verdict.

Every protected run reads ``clock_timestamp()`` on its lock's own session when its work
starts and when it ends, both inside the lock. After the run, in a separate transaction
on another connection, the worker writes that interval with the outcome pgsolo reported
into :data:`RUNS`, whose exclusion constraint (``benchmarks/intervals.py``, shared with
the contention benchmark) refuses two ``completed`` intervals of one key that overlap.
A refused interval is not lost: it goes to :data:`OVERLAPS` with every completed
interval it collides with. Runs reported ``lost`` are kept too, outside the constraint,
with their window (start to report), so that how long a lost run went on can be measured.

``run_once`` is judged by its side effect: the operation inserts one row per operation
key, in its own transaction, into :data:`EFFECTS`; a second success of the same
operation finds the row there, and is written to :data:`OVERLAPS` as a duplicate.

After each attempt the worker fingerprints the connection as its next user gets it
(``chaos/ways.py``); one that differs from the fresh one it recorded at its start, or
still holds an advisory lock, goes to :data:`CHANGED` with both fingerprints. A failed
attempt goes to :data:`FAILURES` with its error's type and the phase it came out of:
``connect`` or ``give back`` (the library's, taking the connection or giving it back),
``work`` (the caller's own statements), ``pgsolo``, or ``check`` (the worker's check of
the connection after the attempt).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from benchmarks.intervals import OVERLAP_ERRORS, interval_table

RUNS = "chaos_runs"
OVERLAPS = "chaos_overlaps"
EFFECTS = "chaos_effects"
CHANGED = "chaos_changed"
FAILURES = "chaos_failures"
RECORD_RETRY_S = 30.0  # a server restart takes a few seconds: keep trying this long

SETUP = (
    f"DROP TABLE IF EXISTS {RUNS}, {OVERLAPS}, {EFFECTS}, {CHANGED}, {FAILURES}",
    interval_table(
        RUNS,
        columns="kind text NOT NULL, route text NOT NULL, worker int NOT NULL,"
        " outcome text NOT NULL, id bigserial PRIMARY KEY",
        judged="outcome = 'completed'",
    ),
    f"""CREATE TABLE {OVERLAPS} (
        slot int, kind text NOT NULL, route text, worker int NOT NULL, during tstzrange,
        other_kind text, other_worker int, other_during tstzrange, what text NOT NULL)""",
    f"""CREATE TABLE {EFFECTS} (
        op_key text PRIMARY KEY, idempotency_key text NOT NULL, worker int NOT NULL)""",
    f"""CREATE TABLE {CHANGED} (
        kind text NOT NULL, worker int NOT NULL, outcome text NOT NULL, what text NOT NULL,
        fresh jsonb NOT NULL, found jsonb NOT NULL)""",
    f"""CREATE TABLE {FAILURES} (
        kind text NOT NULL, worker int NOT NULL, error text NOT NULL, phase text NOT NULL)""",
)

INSERT_RUN = f"""INSERT INTO {RUNS} (slot, during, kind, route, worker, outcome)
    VALUES (%(slot)s, tstzrange(%(start)s, coalesce(%(end)s, clock_timestamp()), '[)'),
            %(kind)s, %(route)s, %(worker)s, %(outcome)s)"""
# The refused interval, with each completed one it collides with (none found: the other
# insert was refused too, by a deadlock while both checked the constraint).
INSERT_OVERLAP = f"""INSERT INTO {OVERLAPS}
    (slot, kind, route, worker, during, other_kind, other_worker, other_during, what)
    SELECT %(slot)s, %(kind)s, %(route)s, %(worker)s, tstzrange(%(start)s, %(end)s, '[)'),
           r.kind, r.worker, r.during, %(what)s
    FROM (SELECT NULL) AS one
    LEFT JOIN {RUNS} r ON r.slot = %(slot)s AND r.outcome = 'completed'
        AND r.during && tstzrange(%(start)s, %(end)s, '[)')"""
DUPLICATE_EFFECT = f"""INSERT INTO {OVERLAPS} (kind, route, worker, other_worker, what)
    SELECT %(kind)s, %(route)s, %(worker)s, e.worker, 'duplicate effect of ' || e.op_key
    FROM {EFFECTS} e WHERE e.op_key = %(op_key)s"""
INSERT_CHANGED = f"""INSERT INTO {CHANGED} (kind, worker, outcome, what, fresh, found)
    VALUES (%s, %s, %s, %s, %s, %s)"""
INSERT_FAILURE = f"INSERT INTO {FAILURES} (kind, worker, error, phase) VALUES (%s, %s, %s, %s)"
EFFECT = f"""INSERT INTO {EFFECTS} (op_key, idempotency_key, worker) VALUES (%s, %s, %s)
    ON CONFLICT (op_key) DO NOTHING RETURNING 1"""


@dataclass
class Run:
    """One protected run, as its worker saw it."""

    kind: str
    route: str
    worker: int
    slot: int
    outcome: str  # completed, failed, lost (skips are not written)
    start: datetime | None  # the database's clock, on the lock's session
    end: datetime | None


class Judge:
    """A worker's own connection to the database, straight (no relay, no pooler), that
    writes its runs after they end; it reconnects through server restarts."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: psycopg.Connection[Any] | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _execute(self, sql: str, params: Any) -> None:
        deadline = time.monotonic() + RECORD_RETRY_S
        while True:
            try:
                if self._conn is None or self._conn.closed:
                    self._conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=5)
                self._conn.execute(sql, params)
            except psycopg.OperationalError:
                self.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
            else:
                return

    def record(self, run: Run) -> str:
        """``recorded``, or ``overlap`` when the database refused the interval."""
        if run.start is None:  # lost before its work began: there is no window
            return "recorded"
        params = {**run.__dict__, "what": "overlapping interval"}
        try:
            self._execute(INSERT_RUN, params)
        except OVERLAP_ERRORS:
            self._execute(INSERT_OVERLAP, params)
            return "overlap"
        return "recorded"

    def duplicate_effect(self, kind: str, route: str, worker: int, op_key: str) -> None:
        params = {"kind": kind, "route": route, "worker": worker, "op_key": op_key}
        self._execute(DUPLICATE_EFFECT, params)

    def changed(
        self, kind: str, worker: int, outcome: str, what: str, fresh: Any, found: Any
    ) -> None:
        """``what``: ``changed`` (the fingerprint differs) or ``leaked`` (a lock is left)."""
        self._execute(INSERT_CHANGED, (kind, worker, outcome, what, Jsonb(fresh), Jsonb(found)))

    def failure(self, kind: str, worker: int, error: str, phase: str) -> None:
        self._execute(INSERT_FAILURE, (kind, worker, error, phase))
