"""``pgsolo.prune()`` and ``pgsolo prune``: by age, on a database of the test's own, it
deletes old ledger rows, once-per-period records a later period superseded (never a job's
latest, so a period still going still skips), and, only when asked, finished operations
(never a started one); in batches; a dry run deletes nothing; bad input refused before
any SQL; a role without DELETE refused with what to do."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

import pgsolo
from _support import Connect, eventually, json_document, pgsolo_cli

NOWHERE = "postgresql://u:pw@127.0.0.1:1/db?connect_timeout=1"


@pytest.fixture
def aged(fresh_db: str) -> Iterator[psycopg.Connection[Any]]:
    """A migrated database of its own, with rows of each table, some 40 days old."""
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        pgsolo.migrate(conn)
        conn.execute(
            "INSERT INTO pgsolo.job_runs (job, lock_key, outcome, started_at, finished_at,"
            " duration_ms, lock_wait_ms, host, pid) SELECT 'report', '1', 'completed',"
            " now() - make_interval(days => d), now() - make_interval(days => d), 1, 0, 'h', 1"
            " FROM generate_series(0, 59) d"  # one a day for 60 days: 20 older than 40 days
        )
        conn.execute(
            "INSERT INTO pgsolo.job_periods (job, period, period_start, completed_at)"
            " SELECT job, 'day', date_trunc('day', now()) - make_interval(days => d),"
            " now() - make_interval(days => d)"
            " FROM generate_series(0, 59) d, (VALUES ('daily'), ('monthly-ish')) j(job)"
        )
        # A job whose only (latest) period record is old: it stays, whatever its age.
        conn.execute(
            "INSERT INTO pgsolo.job_periods (job, period, period_start, completed_at)"
            " VALUES ('rare', 'year', now() - interval '300 days', now() - interval '300 days')"
        )
        conn.execute(
            "INSERT INTO pgsolo.operations (op_key, state, idempotency_key, attempts, result,"
            " created_at, updated_at, finished_at) SELECT 'report@' || d, 'succeeded', 'i' || d,"
            " 1, '1', now() - make_interval(days => d), now() - make_interval(days => d),"
            " now() - make_interval(days => d) FROM generate_series(0, 59) d"
        )
        conn.execute(
            "INSERT INTO pgsolo.operations (op_key, state, idempotency_key, attempts, created_at,"
            " updated_at) VALUES ('stuck', 'started', 'i', 1, now() - interval '90 days',"
            " now() - interval '90 days')"
        )
        yield conn


def count(conn: psycopg.Connection[Any], table: str, where: str = "true") -> int:
    return int(conn.execute(f"SELECT count(*) FROM pgsolo.{table} WHERE {where}").fetchone()[0])  # type: ignore[index]


DAYS_40 = 40 * 86_400


def test_old_rows_go_in_batches_and_what_still_matters_stays(
    aged: psycopg.Connection[Any],
) -> None:
    dry = pgsolo.prune(aged, DAYS_40, operations=True, dry_run=True)
    assert (dry.runs, dry.periods, dry.operations, dry.dry_run) == (20, 40, 20, True)
    assert count(aged, "job_runs") == 60  # a dry run deletes nothing
    pruned = pgsolo.prune(aged, DAYS_40, batch=7)  # several batches per table
    assert (pruned.runs, pruned.periods, pruned.operations) == (20, 40, 0)
    assert count(aged, "job_runs") == 40
    assert count(aged, "job_runs", "finished_at < now() - interval '40 days'") == 0
    # Each job keeps its latest period, so today's run is still skipped; 'rare' keeps its
    # only record, 300 days old.
    assert count(aged, "job_periods", "job = 'rare'") == 1
    assert count(aged, "job_periods", "period_start = date_trunc('day', now())") == 2
    assert count(aged, "operations") == 61  # not asked for: all stay
    again = pgsolo.prune(aged, DAYS_40, operations=True)
    assert (again.runs, again.periods, again.operations) == (0, 0, 20)
    assert count(aged, "operations", "state = 'started'") == 1  # a started one never goes
    assert aged.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_a_pruned_operation_key_runs_again(aged: psycopg.Connection[Any]) -> None:
    """What the documentation warns of: the row is what makes a key run at most once."""
    ran: list[int] = []
    first = pgsolo.run_once(aged, "report@59", lambda ctx: ran.append(1) or "again")
    assert first.outcome == "already-succeeded"
    assert ran == []
    pgsolo.prune(aged, DAYS_40, operations=True)
    second = pgsolo.run_once(aged, "report@59", lambda ctx: ran.append(1) or "again")
    assert second.outcome == "ran"
    assert ran == [1]


def test_an_operation_taken_over_while_prune_chose_it_is_never_deleted(
    aged: psycopg.Connection[Any], fresh_db: str, observer: Any
) -> None:
    """Guards a running attempt: prune chose an old failed (here, finished) operation,
    waited for its row while a retry took it over (`started`), then deleted it, because
    `state <> 'started'` was checked in the subquery that chose the batch, which
    PostgreSQL does not read again for the row it waited for. The running attempt could
    not record its success, and the next call ran the operation again as attempt 1."""
    takeover = psycopg.connect(fresh_db)  # a transaction: it holds the row until it commits
    try:
        takeover.execute(
            "UPDATE pgsolo.operations SET state = 'started', finished_at = NULL, result = NULL,"
            " attempts = attempts + 1 WHERE op_key = 'report@59'"
        )
        done: list[object] = []
        with psycopg.connect(fresh_db, autocommit=True) as pruner:
            pid = pruner.info.backend_pid
            thread = threading.Thread(
                target=lambda: done.append(pgsolo.prune(pruner, DAYS_40, operations=True))
            )
            thread.start()
            eventually(
                lambda: (
                    observer.conn.execute(
                        "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)
                    ).fetchone()
                    == ("Lock",)
                ),
                "prune to wait for the row the takeover holds",
            )
            takeover.commit()
            thread.join(timeout=60)
        (pruned,) = done
        assert pruned.operations == 19  # type: ignore[attr-defined]  # every other old one
        row = aged.execute(
            "SELECT state, attempts FROM pgsolo.operations WHERE op_key = 'report@59'"
        ).fetchone()
        assert row == ("started", 2)
    finally:
        takeover.close()


def test_the_command_line_prunes_and_says_how_much(aged: psycopg.Connection[Any]) -> None:
    dsn = aged.info.dsn + " password=" + (aged.info.password or "")
    dry = pgsolo_cli("prune", "--older-than", "40d", "--dry-run", "--dsn", dsn, "--json")
    assert dry.returncode == 0, dry.stderr
    doc = json_document(dry.stdout)
    assert (doc["dry_run"], doc["rows"]) == (True, {"runs": 20, "periods": 40})
    done = pgsolo_cli("prune", "--older-than", "40d", "--operations", "--dsn", dsn)
    assert done.returncode == 0, done.stderr
    assert "deleted 20 runs, 40 periods, 20 operations older than 3456000s" in done.stdout
    assert count(aged, "job_runs") == 40


def test_a_role_that_may_not_delete_is_refused_with_what_to_do(
    aged: psycopg.Connection[Any],
) -> None:
    role = f"pgsolo_reader_{uuid.uuid4().hex[:8]}"
    aged.execute(f"CREATE ROLE {role}")
    try:
        aged.execute(f"GRANT USAGE ON SCHEMA pgsolo TO {role}")
        aged.execute(f"GRANT SELECT ON ALL TABLES IN SCHEMA pgsolo TO {role}")
        aged.execute(f"SET ROLE {role}")
        with pytest.raises(
            pgsolo.InsufficientPrivilegeError, match="the role that ran pgsolo migrate"
        ):
            pgsolo.prune(aged, DAYS_40)
        aged.execute("RESET ROLE")
        assert count(aged, "job_runs") == 60
    finally:
        aged.execute("RESET ROLE")
        aged.execute(f"DROP OWNED BY {role}")
        aged.execute(f"DROP ROLE {role}")


def test_without_pgsolo_tables_it_says_so(fresh_db: str) -> None:
    with (
        psycopg.connect(fresh_db, autocommit=True) as conn,
        pytest.raises(pgsolo.NotMigratedError),
    ):
        pgsolo.prune(conn, DAYS_40)
    done = pgsolo_cli("prune", "--older-than", "1d", "--dsn", fresh_db)
    assert done.returncode == 2
    assert "nothing to prune" in done.stderr


@pytest.mark.parametrize(
    ("older_than", "options", "says"),
    [
        (0, {}, "older_than must be more than 0"),
        (-1, {}, "older_than must be more than 0"),
        ("40d", {}, "older_than must be a number of seconds"),
        (float("inf"), {}, "older_than"),
        (60, {"batch": 0}, "batch must be an int from 1"),
        (60, {"batch": True}, "batch must be an int from 1"),
        (60, {"operations": "yes"}, "operations must be True or False"),
    ],
)
def test_bad_input_is_refused_before_any_sql(
    older_than: Any, options: dict[str, Any], says: str, connect: Connect
) -> None:
    conn = connect()
    conn.close()  # any statement would fail on it: the refusal comes first
    with pytest.raises(pgsolo.InvalidArgumentError, match=says):
        pgsolo.prune(conn, older_than, **options)


@pytest.mark.parametrize("age", ["0", "day", "forty days", "-1d", "1x"])
def test_a_bad_age_is_a_usage_error_before_connecting(age: str) -> None:
    done = pgsolo_cli("prune", "--older-than", age, "--dsn", NOWHERE)
    assert done.returncode == 2, done.stderr
    assert "--older-than" in done.stderr
