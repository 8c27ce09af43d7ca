"""A worker process for ``locking/test_interruptions.py``: take and let go of a lock in
a tight loop, in one of pgsolo's forms, until a real Ctrl-C (SIGINT, Python's
own handler) stops it, then say what its connection looks like.

Usage: ``python _interrupted_child.py DSN DRIVER KEY_A KEY_B`` (DRIVER: ``psycopg``,
``psycopg2``, ``psycopg-async``, ``asyncpg``). The test drives it line by line on stdin:

- ``go FORM`` (``with``, ``acquire``, ``xact`` (``with xact_lock``), ``run_job`` (a
  session lock), ``run_job-xact`` (a transaction lock), ``run_once``, and ``try-with``,
  ``try-acquire``, ``try-xact`` and ``try-run_job``, the first four as a try without a
  wait): print ``going PID``
  (the backend's pid), then loop FORM until interrupted, and print one JSON report:
  whether the connection is idle (no transaction left open) and still answers
  ``SELECT 1``, the locks pgsolo's books say it holds, and whether they say a
  transaction pgsolo opened there has an owner. The ``acquire`` form's
  handler does what the docs ask of a caller: release the lock if ``lock.acquired``
  says it is held.
- then the test looks at ``pg_locks`` from its own session, and answers ``next`` (keep
  the connection) or ``reset`` (a new one: something was left behind on this one).

A sync driver's interrupt is ``KeyboardInterrupt`` wherever the signal lands. An async
driver runs each ``go`` in ``asyncio.run``, whose Ctrl-C cancels the main task (a task is
interrupted only where it awaits): the loop's coroutine sees ``CancelledError`` and
reports on the same connection before the round ends.
"""

from __future__ import annotations

import asyncio
import json
import signal
import sys
import traceback
from collections.abc import Callable
from typing import Any

import pgsolo
from pgsolo.drivers import adapt
from pgsolo.locking import holdings

WAIT = 5.0  # every form waits (the key is this child's alone, so it never has to)...
TRY = "try-"  # ...but these, which try once: the shells' own path (a try always succeeds)


def wait_of(form: str) -> tuple[str, float | None]:
    """The form without its ``try-``, and the wait it takes."""
    return (form.removeprefix(TRY), None) if form.startswith(TRY) else (form, WAIT)


def granted(acquired: bool) -> None:
    """A transaction lock's key is on pgsolo's books only while its block runs (a job's,
    while it runs), so ``tracked`` cannot show one an interruption left claimed: the next
    try of the key, which is this child's alone, would say busy instead."""
    if not acquired:
        raise RuntimeError("the key was busy: left claimed, or held, by an interrupted round")


def report(
    conn: Any, idle: bool, usable: bool | str, error: BaseException | None, where: str
) -> None:
    """``usable``: True, or why ``SELECT 1`` failed; ``where``: the line the interrupt
    was raised at; ``closed``: whether the connection says it is closed."""
    print(
        json.dumps(
            {
                "where": where,
                # asyncpg says is_closed(); psycopg and psycopg2 say closed
                "closed": bool(conn.is_closed() if hasattr(conn, "is_closed") else conn.closed),
                "idle": idle,
                "usable": usable,
                "tracked": [k.text for k in pgsolo.held_session_locks(conn)],
                "owned": owned(conn),
                "error": None if error is None else repr(error),
            }
        ),
        flush=True,
    )


def owned(conn: Any) -> bool:
    """Whether pgsolo's books say a thread or task owns a transaction pgsolo opened on
    ``conn``: with none open, an owner left there refuses every other thread's
    transaction lock in its own transaction on this connection."""
    driver = adapt(conn)
    return holdings.transaction_owner(driver.connection, driver.backend_pid()) is not None


def raised_at(exc: BaseException) -> str:
    """The innermost line of ``exc``'s traceback, as ``file:line function``."""
    frames = traceback.extract_tb(exc.__traceback__)
    last = frames[-1] if frames else None
    return "" if last is None else f"{last.filename}:{last.lineno} {last.name}"


def listen_to_ctrl_c() -> None:
    """Python's own handler, for one round's loop (a child started from a
    non-interactive shell may inherit SIG_IGN)."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def ignore_ctrl_c() -> None:
    """From the first interrupt's handler to the next round: a second Ctrl-C (the test
    presses again when the child is silent for a second, as when a ``__del__`` swallowed
    the first, and on a loaded machine the report can be that slow) would otherwise end
    the child outside its loop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


# - sync drivers -


Sync = tuple[Any, Callable[[], int], Callable[[], bool], Callable[[], None]]


def sync_connect(dsn: str, driver: str) -> Sync:
    """The connection, its backend pid, whether it is idle, and ``SELECT 1`` on it."""
    if driver == "psycopg":
        import psycopg  # noqa: PLC0415

        conn: Any = psycopg.connect(dsn, autocommit=True)
        return (
            conn,
            lambda: conn.info.backend_pid,
            lambda: conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE,
            lambda: conn.execute("SELECT 1").fetchone(),
        )
    import psycopg2  # noqa: PLC0415
    import psycopg2.extensions  # noqa: PLC0415

    conn = psycopg2.connect(dsn)
    conn.autocommit = True

    def select_one() -> None:
        with conn.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()

    def idle() -> bool:
        return bool(conn.get_transaction_status() == psycopg2.extensions.TRANSACTION_STATUS_IDLE)

    return conn, conn.get_backend_pid, idle, select_one


def sync_loop(conn: Any, key: pgsolo.Key, form: str) -> Callable[[], None] | None:
    """Loop ``form`` until interrupted; return the handler's clean-up, if the form has one."""
    form, wait = wait_of(form)
    if form == "acquire":
        lock = pgsolo.session_lock(conn, key, wait=wait)
        try:
            while True:
                if lock.acquire():
                    lock.release()
        except KeyboardInterrupt:
            if lock.acquired:
                lock.release()
            raise
    n = 0
    while True:
        n += 1
        if form == "with":
            with pgsolo.session_lock(conn, key, wait=wait):
                pass
        elif form == "xact":
            with pgsolo.xact_lock(conn, key, wait=wait) as lock:
                granted(lock.acquired)
        elif form == "run_job":
            job = pgsolo.run_job(conn, key, lambda conn: None, lifetime="session", wait=wait)
            granted(job.outcome == "completed")
        elif form == "run_job-xact":
            job = pgsolo.run_job(conn, key, lambda conn: None, lifetime="xact", wait=wait)
            granted(job.outcome == "completed")
        else:
            pgsolo.run_once(conn, f"interrupted:{key.text}:{n}", lambda ctx: None, wait=WAIT)


def run_sync(dsn: str, driver: str, key: pgsolo.Key) -> None:
    conn, pid, idle, select_one = sync_connect(dsn, driver)
    for line in sys.stdin:
        command, *rest = line.split()
        if command == "reset":
            conn.close()
            conn, pid, idle, select_one = sync_connect(dsn, driver)
            continue
        if command != "go":
            continue
        error: BaseException | None = None
        where = ""
        try:
            # Loads pgsolo's adapter for the driver before the interrupts: loaded first
            # in report(), it took over a second on a busy machine.
            pgsolo.held_session_locks(conn)
            listen_to_ctrl_c()
            print("going", pid(), flush=True)
            sync_loop(conn, key, rest[0])
        except KeyboardInterrupt as interrupt:
            ignore_ctrl_c()
            where = raised_at(interrupt)
        except Exception as exc:
            ignore_ctrl_c()
            if isinstance(exc.__cause__, KeyboardInterrupt):
                # Python 3.11 wraps an exception raised in a class's creation (the first
                # import of a module pgsolo loads when first used) in RuntimeError.
                where = f"wrapped in {type(exc).__name__}: {raised_at(exc.__cause__)}"
            else:
                error = exc
        was_idle = idle()
        try:
            select_one()
            usable: bool | str = True
        except Exception as exc:
            usable = repr(exc)
        report(conn, was_idle, usable, error, where)


# - async drivers -


async def async_connect(dsn: str, driver: str) -> tuple[Any, int, Callable[[], bool], Any]:
    if driver == "psycopg-async":
        import psycopg  # noqa: PLC0415

        conn: Any = await psycopg.AsyncConnection.connect(dsn, autocommit=True)

        async def select_one() -> None:
            await (await conn.execute("SELECT 1")).fetchone()

        def idle() -> bool:
            return bool(conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE)

        return conn, conn.info.backend_pid, idle, select_one
    import asyncpg  # noqa: PLC0415
    from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415

    params = conninfo_to_dict(dsn)
    conn = await asyncpg.connect(
        host=params.get("host"),
        port=params.get("port"),
        user=params.get("user"),
        password=params.get("password"),
        database=params.get("dbname"),
    )
    return (
        conn,
        conn.get_server_pid(),
        lambda: not conn.is_in_transaction(),
        lambda: conn.fetchval("SELECT 1"),
    )


async def async_loop(conn: Any, key: pgsolo.Key, form: str) -> None:
    form, wait = wait_of(form)
    if form == "acquire":
        lock = pgsolo.session_lock(conn, key, wait=wait)
        try:
            while True:
                if await lock.acquire():
                    await lock.release()
        except asyncio.CancelledError:
            if lock.acquired:
                await lock.release()
            raise
    n = 0
    while True:
        n += 1
        if form == "with":
            async with pgsolo.session_lock(conn, key, wait=wait):
                pass
        elif form == "xact":
            async with pgsolo.xact_lock(conn, key, wait=wait) as lock:
                granted(lock.acquired)
        elif form == "run_job":
            job = await pgsolo.run_job_async(conn, key, _nothing, lifetime="session", wait=wait)
            granted(job.outcome == "completed")
        elif form == "run_job-xact":
            job = await pgsolo.run_job_async(conn, key, _nothing, lifetime="xact", wait=wait)
            granted(job.outcome == "completed")
        else:
            await pgsolo.run_once_async(conn, f"interrupted:{key.text}:{n}", _nothing, wait=WAIT)


async def _nothing(_: object) -> None:
    return None


async def async_round(dsn: str, driver: str, key: pgsolo.Key, form: str) -> None:
    conn, pid, idle, select_one = await async_connect(dsn, driver)
    error: BaseException | None = None
    where = ""
    try:
        pgsolo.held_session_locks(conn)  # the adapter loaded first: see run_sync
        print("going", pid, flush=True)
        await async_loop(conn, key, form)
    except asyncio.CancelledError as interrupt:
        ignore_ctrl_c()
        where = raised_at(interrupt)
        task = asyncio.current_task()
        assert task is not None
        task.uncancel()  # Ctrl-C, as asyncio.run delivers it: handled here
    except Exception as exc:
        ignore_ctrl_c()
        error = exc
        try:  # a Ctrl-C asyncio took before the line above must not land in the report
            await asyncio.sleep(0)
        except asyncio.CancelledError:
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
    was_idle = idle()
    try:
        await select_one()
        usable: bool | str = True
    except Exception as exc:
        usable = repr(exc)
    report(conn, was_idle, usable, error, where)
    sys.stdin.readline()  # the test has looked at pg_locks
    await conn.close()


def run_async(dsn: str, driver: str, key: pgsolo.Key) -> None:
    for line in sys.stdin:
        command, *rest = line.split()
        if command == "go":
            listen_to_ctrl_c()  # before asyncio.run, which then puts its own handler in
            asyncio.run(async_round(dsn, driver, key, rest[0]))


def main() -> None:
    ignore_ctrl_c()
    dsn, driver, a, b = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    key = pgsolo.Key((a, b))
    if driver in ("psycopg", "psycopg2"):
        run_sync(dsn, driver, key)
    else:
        run_async(dsn, driver, key)


if __name__ == "__main__":
    main()
