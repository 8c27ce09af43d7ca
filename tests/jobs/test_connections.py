"""The connections a job opens: TCP keepalives unless the DSN says otherwise, and its name in
``pg_stat_activity`` (``application_name``) cut to what PostgreSQL keeps, unless the
caller, the DSN or the environment names it. The name test alike in both flavours is
written once, async, in ``_async/test_connections.py``; scripts/unasync.py generates
``_sync/test_connections.py``.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from _support import (
    app_name_of,
    new_job,
)
from pgsolo import Keep
from pgsolo.drivers.conninfo import server_keepalives
from pgsolo.jobs import run_job
from pgsolo.locking import keepalive_basis


def test_connections_a_job_opens_use_tcp_keepalives_unless_the_dsn_says_otherwise(
    db: str,
) -> None:
    """A half-open connection under a held lock must be noticed by the client too."""

    def fn(conn: psycopg.Connection) -> dict[str, str]:
        return conn.info.get_parameters()

    params = run_job(db, new_job(), fn).value
    assert params is not None
    assert params["keepalives"] == "1"
    assert int(params["keepalives_idle"]) >= 1
    assert int(params["tcp_user_timeout"]) >= 1000
    own = run_job(make_conninfo(db, keepalives_idle="77"), new_job(), fn).value
    assert own is not None
    assert own["keepalives_idle"] == "77"


SERVER_SIDE = ("tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count")


def test_the_server_gives_a_silent_client_up_in_seconds_unless_told_otherwise(db: str) -> None:
    """Guards the leader of a host whose network was cut: libpq's keepalives tell pgsolo
    the server is gone, but only the server's own tell it that the client is, and with the
    kernel's defaults it would keep the client's session locks for 2 h 11 min (measured
    by benchmarks/scenario_leadership.py, "network cut")."""

    def fn(conn: psycopg.Connection) -> list[str]:
        shown = [
            conn.execute(f"SHOW {name}").fetchone() for name in (*SERVER_SIDE, "tcp_user_timeout")
        ]
        return [str(row[0]) for row in shown if row is not None]

    host = str(conninfo_to_dict(db).get("host") or "")
    if not host or host.startswith("/"):  # CI's suite on PostgreSQL 15 connects over TCP
        pytest.skip("keepalives are a TCP connection's: this DSN is a unix socket's")
    idle, interval, count, user_timeout = run_job(db, new_job(), fn).value or []
    assert (idle, interval, count) == ("5", "2", "4")  # 5 + 4 x 2 = 13 s of silence at most
    assert user_timeout == "13000"  # ms
    # What the connection string asks for wins.
    options = "-c tcp_keepalives_idle=77 -c tcp_user_timeout=2000"
    own = run_job(make_conninfo(db, options=options), new_job(), fn).value or []
    assert own == ["77", "2", "4", "2000"]


@pytest.mark.parametrize(
    "keep",
    [Keep(), Keep(interval=5, timeout=30), Keep(interval=0.2, timeout=1), Keep(interval=60)],
    ids=["defaults", "lax", "quick", "rare-beats"],
)
def test_the_server_gives_a_silent_holder_up_only_after_its_keeper_did(keep: Keep) -> None:
    """Guards a leader (or `pgsolo run`, or a session job) with a keeper of its own whose
    host was cut off: the server's keepalives were sized for the default keeper's 11 s
    whatever the Keep, so with Keep(interval=5, timeout=30) the server let a successor in
    at 13 s while the cut-off holder's keeper held on for up to 35 s."""
    settings = server_keepalives(keepalive_basis(keep))
    silence = settings["tcp_keepalives_idle"] + (
        settings["tcp_keepalives_interval"] * settings["tcp_keepalives_count"]
    )
    assert silence > keep.interval + keep.timeout
    assert settings["tcp_user_timeout"] == silence * 1000
    assert server_keepalives(keepalive_basis(None)) == server_keepalives()  # unwatched


@pytest.mark.parametrize("grace", [0.5, 1, 10, 30])
def test_the_server_gives_a_silent_pgsolo_run_up_only_after_command_was_killed(
    grace: float,
) -> None:
    """Guards `pgsolo run` on a host cut off: its keeper gives the lock up after
    --check-interval plus --check-timeout, then COMMAND gets SIGTERM and SIGKILL after
    --grace; the server's keepalives were sized without --grace, so with the default 10 s
    the next host's COMMAND started while the cut one's still ran (6 s of overlap)."""
    keep = Keep(interval=1, timeout=10)  # pgsolo run's defaults
    settings = server_keepalives(keepalive_basis(keep, stopping=grace))
    silence = settings["tcp_keepalives_idle"] + (
        settings["tcp_keepalives_interval"] * settings["tcp_keepalives_count"]
    )
    assert silence > keep.interval + keep.timeout + grace
    assert settings["tcp_user_timeout"] == silence * 1000


def test_a_session_job_with_a_keeper_of_its_own_sizes_the_servers_keepalives_from_it(
    db: str,
) -> None:
    def fn(conn: psycopg.Connection) -> list[int]:
        shown = [conn.execute(f"SHOW {name}").fetchone() for name in SERVER_SIDE]
        return [int(row[0]) for row in shown if row is not None]

    host = str(conninfo_to_dict(db).get("host") or "")
    if not host or host.startswith("/"):
        pytest.skip("keepalives are a TCP connection's: this DSN is a unix socket's")
    keep = Keep(interval=5, timeout=30)
    idle, interval, count = run_job(db, new_job(), fn, lifetime="session", keep=keep).value or []
    assert idle + interval * count > keep.interval + keep.timeout


def test_on_a_unix_socket_no_round_trip_sets_keepalives(db: str) -> None:
    """Keepalives are TCP's: on a unix socket the server ignores them and learns at once
    that a client died, so pgsolo spends no round trip on them there (it cost a new
    session 2 ms, a Celery Singleton task a quarter of its overhead)."""

    def fn(conn: psycopg.Connection) -> list[str]:
        rows = conn.execute(
            "SELECT source FROM pg_settings WHERE name = ANY(%s)",
            ([*SERVER_SIDE, "tcp_user_timeout"],),
        ).fetchall()
        return sorted({str(source) for (source,) in rows})

    host = str(conninfo_to_dict(db).get("host") or "")
    if host and not host.startswith("/"):  # the embedded server of the README's run is one
        pytest.skip("this DSN is a TCP connection's")
    assert run_job(db, new_job(), fn).value == ["default"]


def test_a_long_job_name_is_cut_to_what_postgres_keeps(db: str, observer: Any) -> None:
    job = new_job() + ":" + "x" * 80

    def fn(conn: psycopg.Connection) -> str | None:
        return app_name_of(observer, conn.info.backend_pid)

    assert run_job(db, job, fn).value == f"pgsolo:{job}"[:63]


def test_application_name_given_by_caller_dsn_or_environment_wins(
    db: str, observer: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = new_job()

    def fn(conn: psycopg.Connection) -> str | None:
        return app_name_of(observer, conn.info.backend_pid)

    named_dsn = make_conninfo(db, application_name="from-dsn")
    assert run_job(named_dsn, job, fn).value == "from-dsn"
    assert run_job(db, job, fn, application_name="billing-worker").value == "billing-worker"
    assert run_job(named_dsn, job, fn, application_name="billing-worker").value == "billing-worker"
    monkeypatch.setenv("PGAPPNAME", "from-env")
    assert run_job(db, job, fn).value == "from-env"
    assert run_job(named_dsn, job, fn).value == "from-dsn"
