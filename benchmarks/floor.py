"""The floor of a pair in ``paired.py``: pgsolo's own messages for one operation, sent by
hand through the lowest-cost path of the driver, with nothing of pgsolo's around them.

pgsolo ÷ the recipe mixes two things: what pgsolo's messages cost the server and the
driver (a transaction lock's BEGIN and lock call in one simple query, a session lock's
calls prepared), and what pgsolo's own Python costs between them. The floor takes the
second away: floor ÷ recipe is the best pgsolo could do with the messages it sends, and
pgsolo ÷ floor is its own cost. A goal below floor ÷ recipe is out of reach of pgsolo's
code; one above it is not.

The statements come from :mod:`pgsolo.sql`, so they stay the ones pgsolo sends:
- a session lock: its try and unlock, prepared on the connection (pgsolo prepares them
  after the driver's threshold), by name with the key as parameters; on asyncpg, run
  through its protocol as pgsolo runs them (``_asyncpg_private.ready_run``);
- a transaction lock: ``BEGIN`` and the try (which refuses a standby) in one simple
  query, then ``COMMIT``; on asyncpg, the try's answer read from the row count of its
  rewrite, as pgsolo reads it there (:func:`pgsolo.sql.truth_by_count`);
- a transaction lock's wait (``xact-wait``, psycopg 3 sync): ``BEGIN`` and one slice of
  the wait (:func:`pgsolo.sql.xact_wait`, which sets the slice's ``lock_timeout`` and puts
  the connection's back) in one simple query, the wait prepared on the connection and run
  by ``EXECUTE`` (as pgsolo runs it after the driver's threshold), then ``COMMIT``;
- a job (``job``, ``job-wait``, psycopg 3 sync): a transaction lock's messages, with the
  job's marker set in the first (by its own statement before a try, inside the wait) and
  checked in the COMMIT's (:func:`pgsolo.sql.same_transaction`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
from psycopg import generators, pq

from benchmarks.bench_locks import KEY, NotAcquiredError, Target
from pgsolo import sql
from pgsolo.drivers._asyncpg_private import kept_statement, open_protocol, ready_run
from pgsolo.keys import as_key

__all__ = ["AsyncPsycopgFloor", "AsyncpgFloor", "PsycopgFloor"]


def _prepared(call: str) -> sql.Prepared:
    if not isinstance(call, sql.LockCall):
        raise TypeError(f"not a lock call pgsolo prepares: {call}")
    return call.prepared


def _prepared_wait(wait: str) -> sql.WaitCall:
    if not isinstance(wait, sql.WaitCall):
        raise TypeError(f"not a wait pgsolo prepares: {wait}")
    return wait


_KEY = as_key(KEY)
_TRY = _prepared(sql.acquire(_KEY, "session", wait=False, shared=False))
_UNLOCK = _prepared(sql.unlock(_KEY, shared=False))
_XACT_TRY = sql.acquire(_KEY, "xact", wait=False, shared=False, refuse_standby=True)
_XACT = f"BEGIN; {_XACT_TRY}".encode()
_WAIT_SLICE_MS = 2000  # a first slice of a wait (pgsolo.locking.waits)
_WAIT = _prepared_wait(sql.xact_wait(_KEY, _WAIT_SLICE_MS, shared=False, fencing=False))
_XACT_WAIT = f"BEGIN; {_WAIT.executed}".encode()
_MARKER = "0123456789abcdef"  # a job's marker, fixed here: pgsolo's is fresh every run
_JOB = f"BEGIN; {sql.mark_transaction(_MARKER)}; {_XACT_TRY}".encode()
_JOB_WAIT_FORM = _prepared_wait(
    sql.xact_wait(_KEY, _WAIT_SLICE_MS, shared=False, fencing=False, marker=_MARKER)
)
_JOB_WAIT = f"BEGIN; {_JOB_WAIT_FORM.executed}".encode()
_JOB_COMMIT = "; ".join([*sql.same_transaction(_MARKER), sql.COMMIT]).encode()


def _granted(results: list[pq.abc.PGresult]) -> None:
    if results[-1].get_value(0, 0) != b"t":
        raise NotAcquiredError("the lock was busy")


# A transaction's two messages, by lifetime: the lock's, then the COMMIT's.
_XACT_MESSAGES = {
    "xact": (_XACT, b"COMMIT"),
    "xact-wait": (_XACT_WAIT, b"COMMIT"),
    "job": (_JOB, _JOB_COMMIT),
    "job-wait": (_JOB_WAIT, _JOB_COMMIT),
}


class PsycopgFloor:
    """psycopg 3, sync: libpq's own messages, read by psycopg's own generator."""

    conn: psycopg.Connection[Any]

    def __init__(self, lifetime: str) -> None:
        self.lifetime = lifetime

    def open(self, target: Target) -> None:
        self.conn = psycopg.connect(target.conninfo(), autocommit=True)
        for call in (_TRY, _UNLOCK, _WAIT.prepared, _JOB_WAIT_FORM.prepared):
            self.conn.pgconn.prepare(call.name, call.template)

    def _send(self, send: Any, *args: Any) -> list[pq.abc.PGresult]:
        send(*args)
        return self.conn.wait(generators.execute(self.conn.pgconn))

    def op(self) -> None:
        pgconn = self.conn.pgconn
        if self.lifetime in _XACT_MESSAGES:
            lock, commit = _XACT_MESSAGES[self.lifetime]
            _granted(self._send(pgconn.send_query, lock))
            self._send(pgconn.send_query, commit)
            return
        _granted(self._send(pgconn.send_query_prepared, _TRY.name, list(_TRY.params)))
        self._send(pgconn.send_query_prepared, _UNLOCK.name, list(_UNLOCK.params))

    def close(self) -> None:
        self.conn.close()


class AsyncPsycopgFloor:
    """psycopg 3, async: the same messages, each answer waited for on the event loop."""

    conn: psycopg.AsyncConnection[Any]

    def __init__(self, lifetime: str) -> None:
        self.lifetime = lifetime

    async def open(self, target: Target) -> None:
        self.conn = await psycopg.AsyncConnection.connect(target.conninfo(), autocommit=True)
        for call in (_TRY, _UNLOCK):
            self.conn.pgconn.prepare(call.name, call.template)

    async def _send(self, send: Any, *args: Any) -> list[pq.abc.PGresult]:
        pgconn = self.conn.pgconn
        send(*args)
        pgconn.flush()  # a message of a few bytes goes at once
        loop = asyncio.get_running_loop()
        while pgconn.is_busy():
            readable = loop.create_future()
            loop.add_reader(pgconn.socket, readable.set_result, None)
            try:
                await readable
            finally:
                loop.remove_reader(pgconn.socket)
            pgconn.consume_input()
        results = []
        while (result := pgconn.get_result()) is not None:
            results.append(result)
        return results

    async def op(self) -> None:
        pgconn = self.conn.pgconn
        if self.lifetime == "xact":
            _granted(await self._send(pgconn.send_query, _XACT))
            await self._send(pgconn.send_query, b"COMMIT")
            return
        _granted(await self._send(pgconn.send_query_prepared, _TRY.name, list(_TRY.params)))
        await self._send(pgconn.send_query_prepared, _UNLOCK.name, list(_UNLOCK.params))

    async def close(self) -> None:
        await self.conn.close()


class AsyncpgFloor:
    """asyncpg: its own prepared statements for a session lock's calls, run by its
    protocol; its simple query for a transaction lock's two messages."""

    conn: Any

    def __init__(self, lifetime: str) -> None:
        self.lifetime = lifetime

    async def open(self, target: Target) -> None:
        import asyncpg  # noqa: PLC0415 - optional

        self.conn = await asyncpg.connect(**target.asyncpg_kwargs())
        key = [int(p) for p in _TRY.params]
        self._lock, self._unlock = [
            ready_run(
                open_protocol(self.conn),
                kept_statement(await self.conn.prepare(call.template.decode("ascii"))),
                key,
            )
            for call in (_TRY, _UNLOCK)
        ]
        self._xact = f"BEGIN; {sql.truth_by_count(sql.Truth(_XACT_TRY))}"

    async def op(self) -> None:
        if self.lifetime == "xact":
            tag = await self.conn.execute(self._xact)
            if sql.TRUTH_BY_COUNT[int(tag.rpartition(" ")[2])] is not True:
                raise NotAcquiredError("the lock was busy")
            await self.conn.execute("COMMIT")
            return
        if (await self._lock())[0][0] is not True:
            raise NotAcquiredError("the lock was busy")
        await self._unlock()

    async def close(self) -> None:
        await self.conn.close()
