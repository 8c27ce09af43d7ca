"""Helpers shared by the test modules (imported as ``_support``: pyproject's ``pythonpath``
puts this directory on ``sys.path`` for the test modules in every folder below it).

A helper that tests of both flavours use takes a sync or an async connection: on an async
one it returns an awaitable, which the test awaits. So a test written once, async, under
``_async/`` calls it as ``await helper(conn, ...)``, and its sync twin (where
``scripts/unasync.py`` drops the ``await``) as ``helper(conn, ...)``. A helper that waits
without a connection at hand takes the poll to wait with: ``aeventually`` in async code,
which the twin's ``eventually`` replaces.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from hypothesis import example, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY
from psycopg import sql as pgsql

import pgsolo
from pgsolo import Key, OperationContext, sql
from pgsolo.sql import name_to_sql

T = TypeVar("T")

DEADLINE = 10.0  # generous bound for anything that must happen "soon"; never a speed claim

# -- connections ---------------------------------------------------------------------------

Connect = Callable[..., psycopg.Connection]  # the ``connect`` fixture
AConnect = Callable[..., Awaitable[psycopg.AsyncConnection[Any]]]  # the ``aconnect`` fixture
# ``sync_connect`` in a test written once, async: the name stays in its sync twin
SyncConnect = Connect
AnyConnection = psycopg.Connection[Any] | psycopg.AsyncConnection[Any]

IDLE = psycopg.pq.TransactionStatus.IDLE
INTRANS = psycopg.pq.TransactionStatus.INTRANS

CLOSED_PORT_DSN = "postgresql://u:p@127.0.0.1:1/db"  # nothing listens: connecting fails
# libpq options for a session whose raw blocking statements must end by themselves
STATEMENT_BOUND = "-c statement_timeout=60000"  # no raw blocking wait in a test outlives this
STATEMENT_BOUND_20S = "-c statement_timeout=20000"


@contextlib.contextmanager
def closing_all(open_one: Callable[..., Any]) -> Iterator[Callable[..., Any]]:
    """``open_one`` (a function that opens a connection), wrapped so that every connection
    it opened is closed at the end of the block: what a ``connect``-like fixture yields."""
    opened: list[Any] = []

    def _open(*args: Any, **kwargs: Any) -> Any:
        conn = open_one(*args, **kwargs)
        opened.append(conn)
        return conn

    try:
        yield _open
    finally:
        for conn in opened:
            conn.close()


@contextlib.asynccontextmanager
async def aclosing_all(
    open_one: Callable[..., Awaitable[Any]],
) -> AsyncIterator[Callable[..., Awaitable[Any]]]:
    """:func:`closing_all` for async connections (``open_one`` returns an awaitable)."""
    opened: list[Any] = []

    async def _open(*args: Any, **kwargs: Any) -> Any:
        conn = await open_one(*args, **kwargs)
        opened.append(conn)
        return conn

    try:
        yield _open
    finally:
        for conn in opened:
            await conn.close()


# -- waiting ------------------------------------------------------------------------------


def eventually(predicate: Callable[[], T], what: str, timeout: float = DEADLINE) -> T:
    """Poll ``predicate`` until it returns something truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.02)


async def aeventually(predicate: Callable[[], T], what: str) -> T:
    """:func:`eventually` for a test running in an event loop: it yields to the loop
    (where the keeper's task runs) between polls."""
    deadline = time.monotonic() + DEADLINE
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {DEADLINE}s waiting for {what}")
        await asyncio.sleep(0.02)


async def asleep(seconds: float) -> None:
    """``asyncio.sleep``, under a name that a generated sync twin turns into :func:`sleep`."""
    await asyncio.sleep(seconds)


def sleep(seconds: float) -> None:
    """``time.sleep``: what :func:`asleep` is in a generated sync twin."""
    time.sleep(seconds)


# -- jobs: the table their callables write to, and other sessions' view of them ----------

WORK = "pgsolo_test_job_work"  # rows written by the jobs' callables


class Boom(Exception):
    """The callable's own failure (a job's, an operation's)."""


def unique_name(prefix: str) -> str:
    """``PREFIX:`` and 16 random hex digits: a name no other test (or run) uses."""
    return f"{prefix}:{uuid.uuid4().hex[:16]}"


def new_job(prefix: str = "jobs-test") -> str:
    """A unique job name; used as the (str) key too, so the job is named after it."""
    return unique_name(prefix)


def insert_work(conn: AnyConnection, job: str, note: str) -> Any:
    """A row of the job's own work (awaitable on an async connection)."""
    return conn.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, %s)", (job, note))


def server_now(observer: Any) -> datetime:
    row = observer.conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]  # type: ignore[no-any-return]


def job_log_records(caplog: pytest.LogCaptureFixture, job: str) -> list[Any]:
    """pgsolo's log records of ``job``'s outcomes ("job ..." messages)."""
    return [
        r
        for r in caplog.records
        if r.name == "pgsolo.jobs"
        and r.getMessage().startswith("job ")
        and getattr(r, "pgsolo", {}).get("job") == job
    ]


def sample(name: str, **labels: str) -> float:
    """The value of a Prometheus sample in the default registry (0 when absent)."""
    return REGISTRY.get_sample_value(name, labels) or 0.0


def key_of(job: str) -> Key:
    return pgsolo.as_key(job)


def work_rows(observer: Any, job: str) -> list[str]:
    rows = observer.conn.execute(
        f"SELECT note FROM {WORK} WHERE job = %s ORDER BY note", (job,)
    ).fetchall()
    return [str(note) for (note,) in rows]


def period_rows(observer: Any, job: str) -> list[tuple[Any, ...]]:
    rows: list[tuple[Any, ...]] = observer.conn.execute(
        "SELECT period, host, pid, period_start = date_trunc('day', completed_at, 'UTC')"
        " FROM pgsolo.job_periods WHERE job = %s ORDER BY completed_at",
        (job,),
    ).fetchall()
    return rows


def record_period(conn: psycopg.Connection[Any], job: str) -> None:
    """Record today's period of ``job`` (``period="day"``) from another session: as if
    a run had done the work already, or (behind the lock's back) were doing it."""
    conn.execute(
        "INSERT INTO pgsolo.job_periods (job, period, period_start)"
        " VALUES (%s, 'day', date_trunc('day', now(), 'UTC'))",
        (job,),
    )


def hold(connect: Connect, job: str) -> psycopg.Connection:
    """Another session holding the job's key, the way any other client would (raw SQL)."""
    holder = connect()
    holder.execute(f"SELECT pg_advisory_lock({key_of(job).sql_args})")
    return holder


def unhold(holder: psycopg.Connection, job: str) -> None:
    row = holder.execute(f"SELECT pg_advisory_unlock({key_of(job).sql_args})").fetchone()
    assert row == (True,)


# -- run_once: the operations' rows ---------------------------------------------------------

Ctx = OperationContext[psycopg.Connection]


def new_op(prefix: str = "once-test") -> str:
    """A unique operation key."""
    return unique_name(prefix)


def row_of(observer: Any, op_key: str) -> dict[str, Any] | None:
    row = observer.conn.execute(
        "SELECT state, attempts, idempotency_key, result, error, holder_pid, finished_at"
        " FROM pgsolo.operations WHERE op_key = %s",
        (op_key,),
    ).fetchone()
    if row is None:
        return None
    names = ("state", "attempts", "idempotency_key", "result", "error", "holder_pid", "finished")
    return dict(zip(names, row, strict=True))


def locks_of(observer: Any, conn: AnyConnection) -> set[Any]:
    return observer.advisory(pid=pid_of(conn))  # type: ignore[no-any-return]


def recorder(result: object = "done") -> tuple[list[Any], Callable[[Ctx], object]]:
    """An operation that writes a work row and remembers each context it was given."""
    calls: list[Any] = []

    def operation(ctx: Ctx) -> object:
        calls.append(ctx)
        ctx.conn.execute(f"INSERT INTO {WORK} (job, note) VALUES (%s, %s)", (ctx.op_key, "work"))
        return result

    return calls, operation


# -- backends, as another session sees them -------------------------------------------------


def pid_of(conn: AnyConnection) -> int:
    return conn.info.backend_pid


def backend_state(observer: Any, pid: int) -> tuple[str | None, str | None] | None:
    """(state, query) of a backend in pg_stat_activity, or None when it is gone."""
    row = observer.conn.execute(
        "SELECT state, query FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return (row[0], row[1]) if row else None


def server_pid(conn: psycopg.Connection[Any]) -> int:
    """The server backend this client's statement ran on (not ``conn.info.backend_pid``,
    which behind PgBouncer is the bouncer's own cancel key)."""
    row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return int(row[0])


def activity(observer: Any, pid: int) -> tuple[str | None, str | None]:
    """(state, last query) of backend ``pid`` as pg_stat_activity shows it; (None, None)
    when it is gone."""
    return backend_state(observer, pid) or (None, None)


def terminate(observer: Any, pid: int) -> None:
    """Kill a backend and wait (up to 5s, server side) until it is really gone."""
    row = observer.conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,)).fetchone()
    assert row == (True,)


def backends_named(observer: Any, name: str) -> set[int]:
    """The pids of the sessions whose application_name is ``name``."""
    rows = observer.conn.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (name,)
    ).fetchall()
    return {int(pid) for (pid,) in rows}


def app_name_of(observer: Any, pid: int) -> str | None:
    row = observer.conn.execute(
        "SELECT application_name FROM pg_stat_activity WHERE pid = %s", (pid,)
    ).fetchone()
    return None if row is None else str(row[0])


def in_background(conn: psycopg.Connection, statement: str) -> threading.Thread:
    """Run a (blocking) statement on ``conn`` in a thread; errors there are ignored, the
    test asserts what the server shows."""

    def run() -> None:
        with contextlib.suppress(psycopg.Error):
            conn.execute(statement)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# -- roles of a test's own (the ``make_role`` fixture) --------------------------------------

MakeRole = Callable[..., tuple[str, Callable[[], psycopg.Connection]]]  # the ``make_role`` fixture
# Every role made by a test logs in with it: CI's servers ask for a password over TCP (the
# embedded one trusts its unix socket and ignores it).
ROLE_PASSWORD = "pgsolo-test-role-secret"  # noqa: S105 - throwaway roles' own


def new_role() -> str:
    return f"pgsolo_role_{uuid.uuid4().hex[:10]}"


def role_dsn(dsn: str, role: str) -> str:
    """``dsn``, as ``role`` (made by ``make_role``)."""
    return psycopg.conninfo.make_conninfo(dsn, user=role, password=ROLE_PASSWORD)


def privileges(
    admin: psycopg.Connection, role: str, *, schema_usage: bool = False
) -> set[tuple[str, str]]:
    """Every (object, privilege) ``role`` has been granted in schema pgsolo; with
    ``schema_usage``, the schema's own ``USAGE`` too, as ``("pgsolo", "USAGE")``."""
    rows = admin.execute(
        "SELECT table_name, privilege_type FROM information_schema.role_table_grants"
        " WHERE grantee = %s AND table_schema = 'pgsolo'"
        " UNION SELECT object_name, privilege_type FROM information_schema.role_usage_grants"
        " WHERE grantee = %s AND object_schema = 'pgsolo'",
        (role, role),
    ).fetchall()
    found = {(obj, priv) for obj, priv in rows}
    if schema_usage:
        usage = admin.execute("SELECT has_schema_privilege(%s, 'pgsolo', 'USAGE')", (role,))
        if usage.fetchone() == (True,):
            found.add(("pgsolo", "USAGE"))
    return found


SLICE = 0.3  # the slice of a wait in the tests of long waits (pgsolo waits in 2 s slices)
HOLD = 2.0  # how long a holder keeps the key a long wait waits for: several slices
# The oldest a waiter's snapshot or transaction may be seen: a slice, its round trips and
# a poll of the watch, on two cores shared with other work; far below HOLD.
SLICE_BOUND = 1.0


class SnapshotWatch:
    """From a session of its own (``conn``, autocommit), polls ``pg_stat_activity`` for
    backend ``pid`` until the block ends, and keeps the age in seconds of the oldest
    transaction (``xact_start``) and snapshot (``backend_xmin``) it saw the backend with,
    and whether it saw it wait for a lock.

    A snapshot's xmin says nothing of its age by itself, and stays the same when nothing
    commits, so each poll commits a transaction of its own first (``pg_current_xact_id``): a
    snapshot taken after a poll has a later xmin. A snapshot's age is the time since the
    first poll whose transaction it did not see as finished (at most one poll younger than
    it is)."""

    POLL = 0.02

    def __init__(self, conn: psycopg.Connection[Any], pid: int) -> None:
        self.conn, self.pid = conn, pid
        self.oldest_transaction = self.oldest_snapshot = 0.0
        self.saw_lock_wait = False
        self._polls: list[tuple[int, float]] = []  # (transaction id, when)
        self._stop = threading.Event()
        self._failure: list[BaseException] = []
        self._thread = threading.Thread(target=self._watch, name="snapshot-watch", daemon=True)

    def __enter__(self) -> SnapshotWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(DEADLINE)
        if self._failure:
            raise self._failure[0]

    def _watch(self) -> None:
        try:
            while not self._stop.is_set():
                self._poll()
                self._stop.wait(self.POLL)
        except BaseException as exc:
            self._failure.append(exc)

    def _poll(self) -> None:
        row = self.conn.execute("SELECT pg_current_xact_id()::text::bigint").fetchone()
        assert row is not None
        self._polls.append((int(row[0]), time.monotonic()))
        row = self.conn.execute(
            "SELECT backend_xmin::text::bigint,"
            " extract(epoch FROM clock_timestamp() - xact_start)::float8,"
            " wait_event_type = 'Lock'"
            " FROM pg_stat_activity WHERE pid = %s",
            (self.pid,),
        ).fetchone()
        now = time.monotonic()
        if row is None:
            return
        xmin, transaction_age, waits = row
        if transaction_age is not None:
            self.oldest_transaction = max(self.oldest_transaction, transaction_age)
        if xmin is not None:
            taken_after = next((when for xid, when in self._polls if xid >= xmin), now)
            self.oldest_snapshot = max(self.oldest_snapshot, now - taken_after)
        self.saw_lock_wait = self.saw_lock_wait or bool(waits)


# -- locks: what a test takes, and the state it must leave ----------------------------------


class JobFailedError(Exception):
    """The failure of the work a lock protects, raised by the test inside the block."""


def lock_factory(lifetime: str) -> Callable[..., Any]:
    """``xact_lock`` for "xact", else ``session_lock`` (either takes either flavour)."""
    return pgsolo.xact_lock if lifetime == "xact" else pgsolo.session_lock  # type: ignore[return-value]


def lock_for(conn: AnyConnection, key: Key, lifetime: str, **kw: Any) -> Any:
    return lock_factory(lifetime)(conn, key, **kw)


async def hold_session_lock(conn: psycopg.AsyncConnection[Any], key: Key) -> pgsolo.AsyncLock:
    lock = pgsolo.session_lock(conn, key)
    assert await lock.acquire() is True
    return lock


def other_key(key: Key) -> Key:
    """A second key of the test's own (the ``key`` fixture's, 500,000 further on)."""
    assert isinstance(key.value, tuple)
    return Key((key.value[0], key.value[1] + 500_000))


def assert_clean(conn: AnyConnection, observer: Any) -> Awaitable[None] | None:
    """The connection holds and waits for nothing, is IDLE (not ACTIVE, not idle in
    transaction), and still answers queries (await it on an async connection)."""
    pid = pid_of(conn)
    assert not conn.closed
    assert not conn.broken
    assert conn.info.transaction_status is IDLE
    assert observer.advisory(pid=pid) == set()
    assert observer.advisory(pid=pid, granted=False) == set()
    assert pgsolo.held_session_locks(conn) == []
    if isinstance(conn, psycopg.AsyncConnection):
        return _aanswers_and_ends_idle(conn, "SELECT 42", conn.rollback)
    _answers_and_ends_idle(conn, "SELECT 42", conn.rollback)
    return None


def assert_still_usable(conn: AnyConnection) -> Awaitable[None] | None:
    """The connection answers a query and, with autocommit off, commits; then it is IDLE
    (await it on an async connection)."""
    if isinstance(conn, psycopg.AsyncConnection):
        return _aanswers_and_ends_idle(conn, "SELECT 41 + 1", conn.commit)
    _answers_and_ends_idle(conn, "SELECT 41 + 1", conn.commit)
    return None


def _answers_and_ends_idle(
    conn: psycopg.Connection[Any], query: str, end: Callable[[], None]
) -> None:
    assert conn.execute(query).fetchone() == (42,)
    if not conn.autocommit:
        end()
    assert conn.info.transaction_status is IDLE


async def _aanswers_and_ends_idle(
    conn: psycopg.AsyncConnection[Any], query: str, end: Callable[[], Awaitable[None]]
) -> None:
    cur = await conn.execute(query)
    assert await cur.fetchone() == (42,)
    if not conn.autocommit:
        await end()
    assert conn.info.transaction_status is IDLE


def show_lock_timeout(conn: AnyConnection) -> Any:
    """The session's ``lock_timeout`` (an awaitable of it on an async connection)."""
    if isinstance(conn, psycopg.AsyncConnection):
        return _ashow_lock_timeout(conn)
    row = conn.execute("SHOW lock_timeout").fetchone()
    assert row is not None
    return str(row[0])


async def _ashow_lock_timeout(conn: psycopg.AsyncConnection[Any]) -> str:
    cur = await conn.execute("SHOW lock_timeout")
    row = await cur.fetchone()
    assert row is not None
    return str(row[0])


def has_savepoint(conn: AnyConnection, name: str) -> Any:
    """Whether ``name`` is a savepoint of the open transaction (an awaitable of it on an
    async connection), asked at no cost to the transaction: a savepoint found is released,
    with the probe opened after it; otherwise the probe alone failed, and is rolled back."""
    if isinstance(conn, psycopg.AsyncConnection):
        return _ahas_savepoint(conn, name)
    conn.execute("SAVEPOINT probe")
    try:
        conn.execute(f"RELEASE SAVEPOINT {name}")
    except psycopg.errors.InvalidSavepointSpecification:
        conn.execute("ROLLBACK TO SAVEPOINT probe")
        conn.execute("RELEASE SAVEPOINT probe")
        return False
    return True


async def _ahas_savepoint(conn: psycopg.AsyncConnection[Any], name: str) -> bool:
    await conn.execute("SAVEPOINT probe")
    try:
        await conn.execute(f"RELEASE SAVEPOINT {name}")
    except psycopg.errors.InvalidSavepointSpecification:
        await conn.execute("ROLLBACK TO SAVEPOINT probe")
        await conn.execute("RELEASE SAVEPOINT probe")
        return False
    return True


def insert_note(conn: AnyConnection, table: str, note: str) -> Any:
    """A row in the test's ``table`` (awaitable on an async connection)."""
    return conn.execute(
        pgsql.SQL("INSERT INTO {} VALUES (%s)").format(pgsql.Identifier(table)), (note,)
    )


def notes(observer: Any, table: str) -> list[str]:
    """What the test's ``table`` holds, as another session sees it (what was committed)."""
    rows = observer.conn.execute(
        pgsql.SQL("SELECT note FROM {} ORDER BY note").format(pgsql.Identifier(table))
    ).fetchall()
    return [r[0] for r in rows]


# -- the keeper, as pg_stat_activity shows it -----------------------------------------------

INTERVAL = 0.05  # beats are cheap on a local server; several fit in any test's window
# A beat interval longer than any test waits (DEADLINE): a loss reported at all was seen
# on the socket between beats, since no beat comes in the test's lifetime.
WATCHED_INTERVAL = 3600.0


class OnLost:
    """An ``on_lost`` callback that records what it got, and where it ran: the thread's
    name (a sync keeper's thread) and the task's ("" outside one; an async keeper's
    task). With ``fail``, it then raises that."""

    def __init__(self, fail: BaseException | None = None) -> None:
        self.errors: list[pgsolo.LockLostError] = []
        self.threads: list[str] = []
        self.tasks: list[str] = []
        self._fail = fail
        self._guard = threading.Lock()

    def __call__(self, error: pgsolo.LockLostError) -> None:
        try:
            task = asyncio.current_task()
        except RuntimeError:  # no event loop in this thread
            task = None
        with self._guard:
            self.errors.append(error)
            self.threads.append(threading.current_thread().name)
            self.tasks.append(task.get_name() if task is not None else "")
        if self._fail is not None:
            raise self._fail


def wait_for_beat(
    observer: Any,
    pid: int,
    key: Key,
    *,
    shared: bool = False,
    poll: Callable[..., Any] = eventually,
) -> Any:
    """Until the keeper's statement is the last one backend ``pid`` ran (run something
    else first to wait for a *new* beat). ``poll=aeventually`` in async code (await it)."""
    beat = sql.keeper_beat(key, shared=shared)
    return poll(lambda: activity(observer, pid)[1] == beat, f"a keeper beat on backend {pid}")


async def ainterrupted(
    call: Callable[[], Awaitable[object]], waiting: Callable[[], object]
) -> BaseException | None:
    """Run ``call`` and interrupt it once ``waiting()`` is true, as an async caller is
    interrupted: its task cancelled. Returns what the call raised (a call that ends before
    it waits, a refusal say, is not interrupted: its own ending is returned)."""
    task = asyncio.ensure_future(call())
    await aeventually(lambda: task.done() or waiting(), "the call to wait")
    task.cancel()
    try:
        await task
    except BaseException as exc:  # what the interruption raised is the answer
        return exc
    return None


def interrupted(call: Callable[[], object], waiting: Callable[[], object]) -> BaseException | None:
    """Run ``call`` and interrupt it once ``waiting()`` is true, as Ctrl-C does: a real
    SIGINT to the main thread (Python's handler raises KeyboardInterrupt there). Returns
    what the call raised (a call that ends before it waits is not interrupted)."""
    main = threading.main_thread().ident
    assert main == threading.get_ident(), "a signal interrupts the main thread only"
    guard = threading.Lock()
    running = [True]

    def interrupt() -> None:
        eventually(lambda: not running[0] or waiting(), "the call to wait")
        with guard:
            if running[0]:
                signal.pthread_kill(main, signal.SIGINT)

    interrupter = threading.Thread(target=interrupt)
    interrupter.start()
    try:
        try:
            call()
        finally:
            with guard:
                running[0] = False
            interrupter.join()  # a signal sent just before is handled at this call
    except BaseException as exc:  # what the interruption raised is the answer
        return exc
    return None


def wait_until_lost(
    lock: Any, what: str = "the keeper to report the loss", *, poll: Callable[..., Any] = eventually
) -> Any:
    """Until ``lock`` knows it is lost. ``poll=aeventually`` in async code (await it)."""
    return poll(lambda: lock.lost, what)


# -- threads and processes ------------------------------------------------------------------


def run_threads(targets: list[Callable[[], None]], timeout: float = 30.0) -> list[BaseException]:
    """Run each target in its own thread; join with a bound; return what they raised."""
    errors: list[BaseException] = []
    guard = threading.Lock()

    def wrap(target: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                target()
            except BaseException as exc:
                with guard:
                    errors.append(exc)

        return run

    threads = [threading.Thread(target=wrap(t), daemon=True) for t in targets]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    for thread in threads:
        thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [t for t in threads if t.is_alive()]
    assert not stuck, f"{len(stuck)} thread(s) still running after {timeout}s"
    return errors


class Critical:
    """Counts who is inside; every entry checks it is alone."""

    def __init__(self) -> None:
        self.guard = threading.Lock()
        self.inside = 0
        self.max_inside = 0
        self.entries = 0

    def enter(self) -> None:
        with self.guard:
            self.inside += 1
            self.entries += 1
            self.max_inside = max(self.max_inside, self.inside)
            alone = self.inside == 1
        try:
            assert alone, "two holders inside the critical section at once"
            time.sleep(0.002)
        finally:
            with self.guard:
                self.inside -= 1


class Child:
    """A child Python process whose stdout lines are read with a deadline, and whose
    stdin the test may write to."""

    def __init__(self, script: str, *args: object) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", script, *map(str, args)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.stderr: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._pump_err, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def _pump_err(self) -> None:
        assert self.proc.stderr is not None
        self.stderr.extend(self.proc.stderr)

    def readline(self, timeout: float = 20.0) -> str:
        line = self.poll(timeout)
        if line is None:
            pytest.fail(f"child printed nothing for {timeout}s; stderr: {''.join(self.stderr)}")
        return line

    def poll(self, timeout: float) -> str | None:
        """The next line, or None if the child printed nothing for ``timeout`` seconds."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            return None
        if line is None:
            self.proc.wait(5)
            pytest.fail(
                f"child exited ({self.proc.returncode}) early; stderr: {''.join(self.stderr)}"
            )
        return line

    def send(self, line: str) -> None:
        """Write ``line`` to the child's stdin."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


# -- the command line, run for real -------------------------------------------------------

# What the caller's environment must not decide for a command under test: which database,
# and how libpq connects to it (a DSN on the command line says it all).
CLI_ENV_DROP = (
    "PGSOLO_DSN",
    "DATABASE_URL",
    "PGAPPNAME",
    "PGCONNECT_TIMEOUT",
    "PGTARGETSESSIONATTRS",
    "PGSERVICE",
)


@dataclass(frozen=True)
class CliRun:
    """How a ``pgsolo`` command ended, and how long it took (wall clock)."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def stdout_json(self) -> dict[str, Any]:
        """What ``--json`` printed on stdout (``doctor``, ``locks``...), schema-checked."""
        return json_document(self.stdout)

    def stderr_json(self) -> dict[str, Any]:
        """The JSON object ``pgsolo run --json`` prints as the last line of stderr."""
        assert self.stderr.strip(), "no output on stderr"
        return json_document(self.stderr)


def cli_env() -> dict[str, str]:
    """The environment for a ``pgsolo`` command under test: ours, without CLI_ENV_DROP."""
    env = {k: v for k, v in os.environ.items() if k not in CLI_ENV_DROP}
    return {**env, "PYTHONIOENCODING": "utf-8"}


def main_in_process(argv: list[str]) -> int:
    """``pgsolo.cli.main(argv)`` in this process, leaving pgsolo's log level as it found
    it: a ``-v`` turns pgsolo's INFO lines on for the process, as it should for a command,
    and the tests after this one must not inherit that."""
    from pgsolo.cli import main  # noqa: PLC0415

    logger = logging.getLogger("pgsolo")
    level = logger.level
    try:
        return main(argv)
    finally:
        logger.setLevel(level)


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``python -m pgsolo ARGS``; the caller's DSN variables are not inherited."""
    base = {k: v for k, v in os.environ.items() if k not in ("PGSOLO_DSN", "DATABASE_URL")}
    return subprocess.run(
        [sys.executable, "-m", "pgsolo", *args],
        capture_output=True,
        text=True,
        encoding="utf-8",
        env={**base, "PYTHONIOENCODING": "utf-8", **(env or {})},
        timeout=120,
        check=False,
    )


def touching(marker: Path) -> list[str]:
    """A COMMAND for ``pgsolo run`` that creates ``marker``: whether the file exists says
    whether COMMAND ran."""
    source = "import pathlib, sys; pathlib.Path(sys.argv[1]).touch()"
    return [sys.executable, "-c", source, str(marker)]


def pgsolo_cli(*args: str, within: float = 60.0, env: dict[str, str] | None = None) -> CliRun:
    """Run ``python -m pgsolo ARGS`` with stdin closed and without the caller's DSN
    variables (``env`` adds to what is left); fail the test if it has not ended after
    ``within`` seconds (it is killed)."""
    started = time.monotonic()
    try:  # no traceback on a timeout: its command line can carry a DSN's password
        done = subprocess.run(
            [sys.executable, "-m", "pgsolo", *args],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            encoding="utf-8",
            env={**cli_env(), **(env or {})},
            timeout=within,
            check=False,
        )
    except subprocess.TimeoutExpired:
        done = None
    if done is None:
        pytest.fail(f"pgsolo {' '.join(args[:1])} had not ended after {within}s", pytrace=False)
    return CliRun(done.returncode, done.stdout, done.stderr, time.monotonic() - started)


@contextlib.contextmanager
def pgsolo_in_background(*args: str) -> Iterator[subprocess.Popen[str]]:
    """``python -m pgsolo ARGS`` started with stdin closed, stdout discarded and stderr
    (where ``--json`` reports) piped, without the caller's DSN variables; killed at the
    end of the block if it is still running."""
    running = subprocess.Popen(
        [sys.executable, "-m", "pgsolo", *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )
    try:
        yield running
    finally:
        if running.poll() is None:
            running.kill()
            running.communicate()


# Appends its pid to "ran" and exits with argv[2] at once.
MARK = r"""
import os, sys
from pathlib import Path
with open(Path(sys.argv[1]) / "ran", "a") as f:
    f.write(f"{os.getpid()}\n")
sys.exit(int(sys.argv[2]))
"""


# A COMMAND (script()): touches argv[1]/ready, then waits (60 s at most) for
# argv[1]/go and exits 0.
READY_THEN_GO = r"""
import sys, time
from pathlib import Path
d = Path(sys.argv[1])
(d / "ready").touch()
deadline = time.monotonic() + 60
while not (d / "go").exists() and time.monotonic() < deadline:
    time.sleep(0.02)
"""


def script(source: str, directory: Path, *args: object) -> list[str]:
    """A COMMAND for ``pgsolo run``: Python ``source`` given ``directory`` (to report
    through) and ``args``."""
    return [sys.executable, "-c", source, str(directory), *(str(a) for a in args)]


def run_args(key: str, dsn: str, *, job: str | None = None) -> list[str]:
    """``run --key KEY [--name JOB] --dsn DSN``: the start of most command lines here."""
    return ["run", "--key", key, *(["--name", job] if job else []), "--dsn", dsn]


def a_schedule_tick_passes(conn: psycopg.Connection, job: str) -> None:
    """Move ``job``'s recorded attempts a minute into the past, as if its schedule's next
    tick came now: attempts that start within seconds of each other are hosts racing for
    one tick (``pgsolo.jobs.record.RACE_WINDOW_SECONDS``), not the work falling behind."""
    conn.execute(
        "UPDATE pgsolo.job_runs SET started_at = started_at - interval '1 minute',"
        " finished_at = finished_at - interval '1 minute' WHERE job = %s",
        (job,),
    )


def ledger(conn: psycopg.Connection, job: str) -> list[dict[str, Any]]:
    """``job``'s rows in pgsolo.job_runs, oldest first."""
    cursor = conn.execute(
        "SELECT outcome, reason, exit_code, application_name, lock_key, backend_pid, error,"
        " finished_at >= started_at AS ordered FROM pgsolo.job_runs WHERE job = %s ORDER BY id",
        (job,),
    )
    names = [c.name for c in cursor.description or []]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


def raw_lock_sql(key_text: str) -> str:
    """How someone in psql would take the lock: plain SQL, pgsolo not involved."""
    if ":" in key_text:
        namespace, resource = key_text.split(":")
        return f"SELECT pg_advisory_lock({namespace}, {resource})"
    return f"SELECT pg_advisory_lock({name_to_sql(key_text)})"  # DESIGN §2 derivation


# -- keys ---------------------------------------------------------------------------------

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1

# DESIGN.md §2, normative: name -> (int64 key, int32 half).
VECTORS = {
    "daily-settlement": (-2533923874772390729, -589975127),
    "expired-session-cleanup": (1464048641933150878, 340875387),
    "tenant-export": (-4731608009049143110, -1101663339),
    "Grüße": (-559005354142841542, -130153577),
}


# -- property-based tests (tests/fuzz/) -----------------------------------------------------

# HYPOTHESIS_PROFILE=long (registered in conftest.py) runs each property this many times
# more examples than the modest count it names, for a long run by hand.
FUZZ_SCALE = 50 if os.environ.get("HYPOTHESIS_PROFILE") == "long" else 1


def fuzz(examples: int) -> settings:
    """The settings of one property: ``examples`` examples (times FUZZ_SCALE)."""
    return settings(max_examples=examples * FUZZ_SCALE)


def examples(found: list[Any]) -> Callable[[T], T]:
    """``@example`` for each of ``found``: what a property once found runs every time."""

    def add(test: T) -> T:
        for value in reversed(found):
            test = example(value)(test)  # type: ignore[assignment]
        return test

    return add


# Text a user may type or a program may build: every Unicode category, lone surrogates
# (which no UTF-8 can carry), NUL, quotes, backslashes, %, whitespace only, and long runs of
# multi-byte characters around pgsolo's byte limits.
ANY_CHARACTER = st.one_of(
    st.characters(exclude_categories=()),
    st.characters(categories=["Cs"]),
    st.sampled_from(["\0", "'", '"', "\\", "%", " ", "\t", "\n"]),
)
FRAGMENTS = st.sampled_from(["%s", "%(x)s", "$$", "\\x00", "';--", "E'\\'", "\\u0000", "::int"])
HOSTILE_TEXT = st.one_of(
    st.lists(st.one_of(ANY_CHARACTER, FRAGMENTS), max_size=30).map("".join),
    st.text(st.sampled_from([" ", "\t", "\n", "\u3000", "\u00a0"]), max_size=5),
    st.builds(
        lambda c, n: c * n,
        st.sampled_from(["a", "é", "€", "東", "😀", "\\", "'"]),
        st.integers(250, 1100),
    ),
)


@contextlib.contextmanager
def nothing_sent(conn: psycopg.Connection[Any], observer: Any) -> Iterator[None]:
    """Fail unless the block sends no statement on ``conn``: its last query (as
    pg_stat_activity shows it) is still a marker run just before, its transaction status
    is unchanged, and it holds no advisory lock afterwards."""
    marker = f"SELECT 'pgsolo-fuzz-{uuid.uuid4().hex}'"
    conn.execute(marker)
    status = conn.info.transaction_status
    yield
    assert conn.info.transaction_status == status
    assert activity(observer, conn.info.backend_pid)[1] == marker
    assert observer.advisory(pid=conn.info.backend_pid) == set()


def json_document(text: str) -> dict[str, Any]:
    """The one ``--json`` document in ``text`` (its last line), checked against the JSON
    Schema its ``schema`` field names (``pgsolo/cli/schemas/<command>.json``)."""
    return valid_document(json.loads(text.strip().splitlines()[-1]))


def valid_document(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc``, checked against the JSON Schema its ``schema`` field names
    (``pgsolo.<name>/1``: ``pgsolo/cli/schemas/<name>.json``, whose ``$ref`` to another
    of the package's schemas is followed)."""
    import jsonschema  # noqa: PLC0415 - only the tests of --json need it
    from referencing import Registry, Resource  # noqa: PLC0415 - jsonschema's own

    schemas = Path(pgsolo.__file__).parent / "cli" / "schemas"
    registry: Registry[Any] = Registry().with_resources(
        (path.name, Resource.from_contents(json.loads(path.read_text(encoding="utf-8"))))
        for path in schemas.glob("*.json")
    )
    name = doc["schema"].removeprefix("pgsolo.").split("/")[0]
    jsonschema.Draft202012Validator(
        registry.contents(f"{name}.json"),
        registry=registry,
        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER,
    ).validate(doc)
    return dict(doc)


DJANGO_PROJECT = Path(__file__).parent / "django_project"


def manage_py(dsn: str, *args: str, **env: str) -> dict[str, Any]:
    """How to start ``python manage.py ARGS`` of the test project (``tests/django_project``)
    on the database at ``dsn``: the keyword arguments of ``subprocess.run`` or ``Popen``;
    ``env`` adds to its environment (the project's settings read it)."""
    src = Path(pgsolo.__file__).parents[1]
    return {
        "args": [sys.executable, "manage.py", *args],
        "cwd": DJANGO_PROJECT,
        "env": {**os.environ, "PGSOLO_TEST_DSN": dsn, "PYTHONPATH": str(src), **env},
        "stdin": subprocess.DEVNULL,
        "text": True,
    }


def manage(dsn: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python manage.py ARGS`` (:func:`manage_py`), run to its end."""
    return subprocess.run(
        **manage_py(dsn, *args, **env), capture_output=True, timeout=120, check=False
    )
