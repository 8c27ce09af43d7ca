"""The relay in a user's own suite: their job fails cleanly (``DatabaseUnavailableError``,
nothing run) while the network is blackholed, and loses its lock, with their ``on_lost``
run, when the relay resets its connection; and what a blackhole holds arrives after it."""

from __future__ import annotations

import select
import threading
from typing import Any

import psycopg
import pytest

from _support import eventually
from pgsolo.drivers import adapt
from pgsolo.testing import Relay

from .conftest import UserSuite

CUT = """
import time

import pytest
from psycopg.conninfo import make_conninfo

import pgsolo


def export(conn):
    return "exported"


def test_the_export_fails_cleanly_when_the_network_is_down(pgsolo_relay):
    ran = []
    dsn = make_conninfo(pgsolo_relay.dsn, connect_timeout=1)
    with pgsolo_relay.blackholed(), pytest.raises(pgsolo.DatabaseUnavailableError):
        pgsolo.run_job(dsn, "export", lambda conn: ran.append(conn))
    assert ran == []
    assert pgsolo.run_job(dsn, "export", export).value == "exported"  # the network is back


def test_on_lost_runs_when_the_connection_is_reset(pgsolo_relay):
    losses = []

    def export(conn):
        pgsolo_relay.reset()
        deadline = time.monotonic() + 10
        while not losses and time.monotonic() < deadline:
            time.sleep(0.05)

    keep = pgsolo.Keep(interval=0.1, on_lost=losses.append)
    with pytest.raises(pgsolo.LockLostError):
        pgsolo.run_job(pgsolo_relay.dsn, "export", export, lifetime="session", keep=keep)
    assert [loss.reason for loss in losses] == ["connection-lost"]
"""


def test_a_users_job_fails_cleanly_when_the_relay_cuts_the_network(
    user_suite: UserSuite,
) -> None:
    user_suite(CUT).assert_outcomes(passed=2)


def test_a_blackhole_holds_what_it_holds_and_passes_it_on_after(dsn: str) -> None:
    """A blackhole is a partition that heals: a statement sent during it gets no answer
    until it ends, and then its answer, on the same connection."""
    with Relay(dsn) as relay, psycopg.connect(relay.dsn, autocommit=True) as conn:
        answered = threading.Event()
        with relay.blackholed():
            sender = threading.Thread(
                target=lambda: (conn.execute("SELECT 1").fetchone(), answered.set())
            )
            sender.start()
            assert not answered.wait(0.5)
        assert answered.wait(10)
        sender.join()
        assert conn.execute("SELECT 2").fetchone() == (2,)


def test_a_swap_moves_two_idle_connections_to_each_others_session(dsn: str) -> None:
    """What a transaction-pooling proxy does between transactions: after swap() each
    client runs on the other's session, unknown to it, and closing one leaves the
    other's connection working."""
    with (
        Relay(dsn) as relay,
        psycopg.connect(relay.dsn, autocommit=True) as first,
        psycopg.connect(relay.dsn, autocommit=True) as second,
    ):
        ports = [adapt(conn).client_address()[1] for conn in (first, second)]  # type: ignore[index]
        first_pid, second_pid = first.info.backend_pid, second.info.backend_pid
        first.execute("SET application_name = 'first'")
        relay.swap(*ports)
        assert first.info.backend_pid == first_pid  # as the client was told at login
        assert first.execute("SELECT pg_backend_pid()").fetchone() == (second_pid,)
        assert second.execute("SELECT pg_backend_pid()").fetchone() == (first_pid,)
        assert second.execute("SHOW application_name").fetchone() == ("first",)
        with pytest.raises(ValueError, match="no connection from port 1 "):
            relay.swap(ports[0], 1)
        first.close()
        assert second.execute("SELECT 2").fetchone() == (2,)


def test_closing_the_relay_ends_its_connections(dsn: str) -> None:
    relay = Relay(dsn)
    with psycopg.connect(relay.dsn, autocommit=True) as conn:
        relay.close()
        with pytest.raises(psycopg.OperationalError):
            conn.execute("SELECT 1")


def test_a_cut_ends_the_servers_session_and_tells_the_client_nothing(
    dsn: str, observer: Any
) -> None:
    """A network cut once the server gave the client up: the session, and its lock, end on
    the server, while the client's connection stays open and silent (no end of stream, no
    reset), and what it sends is answered by nobody."""
    with Relay(dsn) as relay:
        conn = psycopg.connect(relay.dsn, autocommit=True)
        try:
            conn.execute("SELECT pg_advisory_lock(424242)")
            pid = conn.info.backend_pid
            assert relay.cut() == 1
            eventually(
                lambda: (
                    observer.conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)
                    ).fetchone()
                    == (0,)
                ),
                "the server to end the cut session",
            )
            readable, _, _ = select.select([conn.fileno()], [], [], 0.5)
            assert readable == []  # nothing arrives: not even the end of the connection
            conn.pgconn.send_query(b"SELECT 1")  # sent, and never answered
            conn.pgconn.flush()
            readable, _, _ = select.select([conn.fileno()], [], [], 0.5)
            assert readable == []
        finally:
            conn.pgconn.finish()  # closed here: a statement would wait for an answer
            conn.close()
