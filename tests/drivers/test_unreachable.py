"""A database that does not answer: pgsolo gives up in bounded time, says the database is
unavailable (exit 69, ``DatabaseUnavailableError``) and never starts the work.

Two kinds of silence, both on loopback. A *blackhole*: a port that accepts TCP connections
and never sends a byte (a hung server or host, a firewall that swallows the traffic after
the handshake), so only a connect timeout ends the wait. And a real server behind a relay
that passes the login through and then drops every answer (a server that froze right after
the connection opened), so only a deadline on pgsolo's own statements ends it.

The bounds are generous multiples of the timeouts under test: pgsolo's connect timeout
(5 s by default), ``--connect-timeout`` or the DSN's ``connect_timeout``, and the deadline
of pgsolo's own statements (30 s by default, ``--check-timeout`` for ``pgsolo run``).
"""

from __future__ import annotations

import asyncio
import select
import socket
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import psycopg
import pytest

import pgsolo
from _support import CliRun, pgsolo_cli, touching
from pgsolo import Key
from pgsolo.testing import Relay

CONNECT_BOUND = 20.0  # giving up at the default connect timeout (5 s), with room to spare
STATEMENT_BOUND = 45.0  # giving up at the default deadline of pgsolo's statements (30 s)
PASSWORD = "s3cret-pw"  # noqa: S105 - a made-up one that must never be shown


class Blackhole:
    """A loopback port that accepts TCP connections and never answers: every connection
    is held open, never read from and never written to, until :meth:`close`."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.port = int(self.listener.getsockname()[1])
        self._held: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def dsn(self, query: str = "") -> str:
        """A URL to the blackhole, with a password that must never be shown."""
        return f"postgresql://u:{PASSWORD}@127.0.0.1:{self.port}/db{query}"

    @property
    def accepted(self) -> int:
        with self._lock:
            return len(self._held)

    def close(self) -> None:
        """Stop accepting and close every held connection: a client still waiting on one
        sees it closed, and a new one is refused."""
        self._closing.set()
        self._thread.join(timeout=10)
        self.listener.close()
        with self._lock:
            for conn in self._held:
                conn.close()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                self._held.append(conn)


@pytest.fixture
def blackhole() -> Iterator[Blackhole]:
    hole = Blackhole()
    try:
        yield hole
    finally:
        hole.close()


@dataclass(frozen=True)
class Ended:
    """How a call that ran in a thread ended."""

    seconds: float
    value: object = None
    error: BaseException | None = None


def ended_within(bound: float, call: Callable[[], object], what: str) -> Ended:
    """Run ``call`` in a thread; fail the test if it has not returned or raised after
    ``bound`` seconds (the thread is left to the fixtures' teardown, which closes what
    it hangs on)."""
    box: list[Ended] = []

    def target() -> None:
        started = time.monotonic()
        try:
            value = call()
        except BaseException as exc:  # handed to the test
            box.append(Ended(time.monotonic() - started, error=exc))
        else:
            box.append(Ended(time.monotonic() - started, value=value))

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(bound)
    if thread.is_alive():
        pytest.fail(f"{what} had not ended after {bound}s")
    return box[0]


def recording(calls: list[object]) -> Callable[..., object]:
    """The work of a job that must never run: it records that it did."""

    def work(*args: Any) -> object:
        calls.append(args)
        return "ran"

    return work


# -- the fixture itself -----------------------------------------------------------------


def test_a_connection_to_the_blackhole_waits_until_it_is_closed(blackhole: Blackhole) -> None:
    """Guards the fixture: a client without a connect timeout hangs on the silent port
    (the wait every other test here relies on pgsolo to bound), and is released when the
    fixture closes it."""
    ended: list[BaseException | None] = []

    def connect() -> None:
        try:
            psycopg.connect(blackhole.dsn()).close()
        except psycopg.Error as exc:
            ended.append(exc)
        else:
            ended.append(None)

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(2.0)
    assert thread.is_alive(), f"the connection attempt ended within 2 s: {ended}"
    assert blackhole.accepted >= 1
    blackhole.close()
    thread.join(10.0)
    assert not thread.is_alive()
    assert len(ended) == 1
    assert isinstance(ended[0], psycopg.OperationalError)


def test_the_relay_passes_the_login_and_then_answers_nothing(dsn: str) -> None:
    """Guards the fixture: through ``Relay(freeze_after_login=True)`` a client
    connects and logs in, and then its statements get no answer at all."""
    with Relay(dsn, freeze_after_login=True) as relay:
        conn = psycopg.connect(relay.dsn, autocommit=True, connect_timeout=10)
        try:
            assert relay.frozen_connections == 1
            conn.pgconn.send_query(b"SELECT 1")
            conn.pgconn.flush()
            readable, _, _ = select.select([conn.fileno()], [], [], 2.0)
            assert readable == []  # two seconds, and not a byte of an answer
        finally:
            conn.close()  # not psycopg's exit, which would send a COMMIT after the query


# -- pgsolo run: connect timeouts ----------------------------------------------------------


def test_run_gives_up_at_the_default_connect_timeout_with_69(
    blackhole: Blackhole, tmp_path: Path
) -> None:
    """``pgsolo run`` against a server that never answers ends with 69 (database
    unavailable) instead of hanging, without starting COMMAND and without the password."""
    marker = tmp_path / "ran"
    done = pgsolo_cli(
        "run",
        "--dsn",
        blackhole.dsn(),
        "--key",
        "x",
        "--json",
        "--",
        *touching(marker),
        within=CONNECT_BOUND,
    )
    assert done.returncode == 69, done.stderr
    assert not marker.exists()
    assert blackhole.accepted >= 1  # it did reach the silent port
    report = done.stderr_json()
    assert report["outcome"] is None
    assert report["reason"] == "database-unavailable"
    assert PASSWORD not in done.stdout + done.stderr


def test_run_connect_timeout_option_bounds_the_wait(blackhole: Blackhole, tmp_path: Path) -> None:
    """``pgsolo run --connect-timeout 1`` gives up after about a second (libpq waits at
    least 2 s; the bound leaves room for a slow machine), without starting COMMAND."""
    marker = tmp_path / "ran"
    done = pgsolo_cli(
        "run",
        "--key",
        "x",
        "--dsn",
        blackhole.dsn(),
        "--connect-timeout",
        "1",
        "--",
        *touching(marker),
        within=CONNECT_BOUND,
    )
    assert done.returncode == 69, done.stderr
    assert done.seconds < 8.0
    assert not marker.exists()


def test_connect_timeout_in_the_dsn_wins_over_the_default(
    blackhole: Blackhole, tmp_path: Path
) -> None:
    """A ``connect_timeout`` the DSN sets is the one used: with 1 (2 s for libpq) and no
    option, ``pgsolo run`` gives up 3 s before the same command with the 5 s default, run
    beside it (side by side, so that a busy machine slows both alike; an absolute bound
    failed on a loaded machine, where starting Python took seconds)."""
    marker = tmp_path / "ran"

    def run(query: str) -> CliRun:
        dsn = blackhole.dsn(query)
        command = ["--key", "x", "--", *touching(marker)]
        return pgsolo_cli("run", "--dsn", dsn, *command, within=CONNECT_BOUND)

    with ThreadPoolExecutor(2) as pool:
        own, default = pool.map(run, ["?connect_timeout=1", ""])
    assert (own.returncode, default.returncode) == (69, 69), own.stderr + default.stderr
    assert "(connect_timeout 2s)" in own.stderr
    assert "(connect_timeout 5s)" in default.stderr
    assert own.seconds + 1.5 < default.seconds, (own.seconds, default.seconds)
    assert not marker.exists()


# -- the other commands --------------------------------------------------------------------


def test_every_command_gives_up_with_69(blackhole: Blackhole) -> None:
    """Each command that talks to the database ends with 69 against a server that never
    answers, within the connect timeout, and never shows the password. (They run side
    by side: each waits out the same timeout.)"""
    commands = ["doctor", "locks", "history", "migrate"]

    def run(command: str) -> CliRun:
        return pgsolo_cli(command, "--dsn", blackhole.dsn(), within=CONNECT_BOUND)

    with ThreadPoolExecutor(len(commands)) as pool:
        runs = dict(zip(commands, pool.map(run, commands), strict=True))
    ended = {command: done.returncode for command, done in runs.items()}
    assert ended == dict.fromkeys(commands, 69), {c: d.stderr for c, d in runs.items()}
    for done in runs.values():
        assert "database unavailable" in done.stderr
        assert PASSWORD not in done.stdout + done.stderr


# -- the library -------------------------------------------------------------------------


@pytest.mark.parametrize("lifetime", ["xact", "session"])
def test_run_job_raises_database_unavailable_without_calling_fn(
    blackhole: Blackhole, key: Key, lifetime: Literal["xact", "session"]
) -> None:
    """``run_job(dsn, ...)`` against a server that never answers raises
    ``DatabaseUnavailableError`` (a ``PgsoloError``) within the connect timeout; the
    work never runs and the error does not show the password."""
    calls: list[object] = []
    ended = ended_within(
        CONNECT_BOUND,
        lambda: pgsolo.run_job(blackhole.dsn(), key, recording(calls), lifetime=lifetime),
        "run_job against a server that does not answer",
    )
    assert isinstance(ended.error, pgsolo.DatabaseUnavailableError), ended
    assert isinstance(ended.error, pgsolo.PgsoloError)
    assert PASSWORD not in str(ended.error)
    assert calls == []


async def test_run_job_async_raises_database_unavailable_without_calling_fn(
    blackhole: Blackhole, key: Key
) -> None:
    """The async twin: ``run_job_async(dsn, ...)`` gives up the same way."""
    calls: list[object] = []

    async def work(conn: object) -> str:
        calls.append(conn)
        return "ran"

    try:
        async with asyncio.timeout(CONNECT_BOUND):
            with pytest.raises(pgsolo.DatabaseUnavailableError) as caught:
                await pgsolo.run_job_async(blackhole.dsn(), key, work)
    except TimeoutError:
        pytest.fail(f"run_job_async had not ended after {CONNECT_BOUND}s")
    assert isinstance(caught.value, pgsolo.PgsoloError)
    assert PASSWORD not in str(caught.value)
    assert calls == []


def _chain(error: BaseException) -> list[BaseException]:
    """``error`` and every exception chained to it, as a traceback or a tracker walks them."""
    seen: list[BaseException] = []
    while error is not None and error not in seen:
        seen.append(error)
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return seen


@pytest.mark.parametrize("form", ["at-sign", "refused"])
def test_a_failed_connect_chains_nothing_that_holds_the_password(key: Key, form: str) -> None:
    """Guards the cause of DatabaseUnavailableError: it was psycopg's own error, whose
    message quoted the part of a password after an unencoded '@' (libpq's "host") and
    whose pgconn keeps the whole password in clear, for every traceback, error tracker and
    debugger to show. Its cause is now a copy of that error saying what pgsolo says."""
    host = f"u:{PASSWORD}@127.0.0.1:1" if form == "refused" else f"u:Se@{PASSWORD}@127.0.0.1"
    dsn = f"postgresql://{host}/db?connect_timeout=5"
    with pytest.raises(pgsolo.DatabaseUnavailableError) as raised:
        pgsolo.run_job(dsn, key, recording([]))
    chain = _chain(raised.value)
    assert len(chain) == 2  # pgsolo's error, and the driver's error as pgsolo says it
    assert isinstance(chain[1], psycopg.OperationalError)
    for error in chain:
        shown = "".join(traceback.format_exception(error)) + repr(vars(error)) + repr(error)
        assert PASSWORD not in shown
        assert getattr(error, "pgconn", None) is None


BAD_DSNS = [
    # An empty port is libpq's default port, a usable string: a quote left open is not.
    pytest.param(f"host=x password='{PASSWORD}", id="unterminated-quote"),
    # libpq reads the next pair as the port's value: "password=s3cret-pw"
    pytest.param(f"host=x port= password={PASSWORD}", id="port-swallows-password"),
    pytest.param(f"postgresql://u:{PASSWORD}@h:notaport/db", id="url-port-not-a-number"),
]


@pytest.mark.parametrize("dsn", BAD_DSNS)
def test_an_unusable_dsn_is_a_usage_error_without_the_password(key: Key, dsn: str) -> None:
    """A connection string libpq cannot use is the caller's mistake: a ``UsageError``
    subclass, not an unavailable database, and its message never shows the password."""
    calls: list[object] = []
    ended = ended_within(
        CONNECT_BOUND,
        lambda: pgsolo.run_job(dsn, key, recording(calls)),
        "run_job with an unusable DSN",
    )
    assert isinstance(ended.error, pgsolo.UsageError), ended
    assert PASSWORD not in str(ended.error)
    assert calls == []


@pytest.mark.parametrize("dsn", BAD_DSNS)
def test_run_with_an_unusable_dsn_exits_2_without_the_password(dsn: str, tmp_path: Path) -> None:
    """``pgsolo run`` with such a string is a usage error (exit 2), COMMAND does not start,
    and no output shows the password."""
    marker = tmp_path / "ran"
    done = pgsolo_cli("run", "--dsn", dsn, "--key", "x", "--", *touching(marker))
    assert done.returncode == 2, done.stderr
    assert not marker.exists()
    assert PASSWORD not in done.stdout + done.stderr


# -- a server that stops answering after the login ---------------------------------------


def test_run_gives_up_when_the_server_stops_answering_after_login(
    dsn: str, key: Key, tmp_path: Path
) -> None:
    """The connection opens, then no statement is ever answered: ``pgsolo run
    --check-timeout 1`` ends (69, or 70 if it counted it as a lost lock) in bounded time,
    and COMMAND never starts, since no lock was ever confirmed."""
    marker = tmp_path / "ran"
    with Relay(dsn, freeze_after_login=True) as relay:
        done = pgsolo_cli(
            "run",
            "--check-timeout",
            "1",
            "--dsn",
            relay.dsn,
            "--key",
            key.text,
            "--",
            *touching(marker),
            within=CONNECT_BOUND,
        )
        assert relay.frozen_connections >= 1  # it logged in before the answers stopped
    assert done.returncode in (69, 70), done.stderr
    assert not marker.exists()


def test_locks_gives_up_when_the_server_stops_answering_after_login(dsn: str) -> None:
    """``pgsolo locks`` on a connection whose server stops answering after the login ends
    with 69 once the deadline of pgsolo's own statements (30 s) has passed."""
    with Relay(dsn, freeze_after_login=True) as relay:
        done = pgsolo_cli("locks", "--dsn", relay.dsn, within=STATEMENT_BOUND)
        assert relay.frozen_connections >= 1
    assert done.returncode == 69, done.stderr


@pytest.mark.parametrize("flavour", ["sync", "async"])
def test_a_connection_that_ends_under_pgsolos_first_statement_is_unavailable(
    dsn: str, observer: Any, monkeypatch: pytest.MonkeyPatch, flavour: str
) -> None:
    """A backend terminated just as pgsolo opened its connection, under its first round
    trip (the one that sizes the server's keepalives, over TCP): before, run_job raised
    psycopg's own OperationalError or AdminShutdown; now the database is unavailable."""
    from pgsolo.drivers._async.psycopg_driver import AsyncPsycopgDriver  # noqa: PLC0415
    from pgsolo.drivers._sync.psycopg_driver import PsycopgDriver  # noqa: PLC0415

    host = str(psycopg.conninfo.conninfo_to_dict(dsn).get("host") or "")
    if not host or host.startswith("/"):  # the embedded server of the README's run is one
        pytest.skip("that first round trip sizes TCP keepalives: this DSN is a unix socket's")
    terminated: list[int] = []

    def terminating(statements: Any, pid: int) -> None:
        if any("pg_settings" in s for s in statements) and not terminated:
            terminated.append(pid)
            observer.conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))

    sync_original, async_original = PsycopgDriver.fetch_value, AsyncPsycopgDriver.fetch_value

    def fetch_value(driver: Any, statements: Any, *args: Any) -> object:
        terminating(statements, driver.backend_pid())
        return sync_original(driver, statements, *args)

    async def afetch_value(driver: Any, statements: Any, *args: Any) -> object:
        terminating(statements, driver.backend_pid())
        return await async_original(driver, statements, *args)

    monkeypatch.setattr(PsycopgDriver, "fetch_value", fetch_value)
    monkeypatch.setattr(AsyncPsycopgDriver, "fetch_value", afetch_value)
    ran: list[object] = []

    async def awork(conn: Any) -> None:
        ran.append(conn)

    def attempt() -> object:
        if flavour == "sync":
            return pgsolo.run_job(dsn, "first-statement", ran.append, raise_errors=False)
        return asyncio.run(pgsolo.run_job_async(dsn, "first-statement", awork, raise_errors=False))

    with pytest.raises(pgsolo.DatabaseUnavailableError) as raised:
        attempt()
    assert terminated, "pgsolo's first round trip was not sent"
    assert ran == []
    password = psycopg.conninfo.conninfo_to_dict(dsn).get("password")
    assert not password or password not in str(raised.value)
