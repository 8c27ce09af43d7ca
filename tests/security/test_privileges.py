"""What pgsolo needs from the database role, tested with roles that have exactly that.

Every test runs in a database of its own (``fresh_db``) with roles made for it
(``CREATE ROLE ... LOGIN PASSWORD``, for servers that ask for one): locks alone need
nothing beyond PostgreSQL's defaults; jobs, operation keys and fencing need the grants of
``pgsolo migrate --grant-to``; a missing privilege is an
:class:`~pgsolo.InsufficientPrivilegeError` whose ``needs`` are the statements that fix it
(the tests run them), never the driver's raw error. docs/security.md is the table.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import make_conninfo

import pgsolo
from _support import MakeRole, json_document, pgsolo_cli, privileges, role_dsn
from pgsolo import InsufficientPrivilegeError, InvalidArgumentError, sql
from pgsolo.schema import check_roles, migrate_to, schema_version
from pgsolo.sql.schema import FEATURE_PRIVILEGES


def grant(admin: psycopg.Connection, error: InsufficientPrivilegeError) -> None:
    """Do what the error says an administrator should."""
    assert error.needs
    for statement in error.needs:
        assert statement in str(error)
        admin.execute(statement.encode())


# -- (a) locks only -----------------------------------------------------------------------


def test_locks_and_the_keeper_need_nothing_beyond_the_defaults(make_role: MakeRole) -> None:
    _, connect = make_role()
    conn = connect()
    with pgsolo.xact_lock(conn, "a-lock") as lock:
        assert lock.acquired
    with pgsolo.session_lock(conn, "a-lock", keep=True, wait=1) as lock:
        assert lock.acquired
        lock.check()
    assert pgsolo.is_locked(connect(), "a-lock") is False


def test_a_revoked_lock_function_names_the_grant_that_gives_it_back(
    admin: psycopg.Connection, make_role: MakeRole
) -> None:
    """``pgsolo doctor`` advises revoking EXECUTE from PUBLIC; a role not granted it back
    gets pgsolo's error, naming the function, and nothing is held."""
    admin.execute("REVOKE EXECUTE ON FUNCTION pg_try_advisory_xact_lock(bigint) FROM PUBLIC")
    role, connect = make_role()
    conn = connect()
    with pytest.raises(InsufficientPrivilegeError) as denied:
        pgsolo.xact_lock(conn, "revoked").__enter__()
    assert denied.value.needs == (
        f'GRANT EXECUTE ON FUNCTION pg_try_advisory_xact_lock(bigint) TO "{role}"',
    )
    assert isinstance(denied.value.__cause__, psycopg.errors.InsufficientPrivilege)
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    grant(admin, denied.value)
    with pgsolo.xact_lock(conn, "revoked") as lock:
        assert lock.acquired


def test_fencing_needs_the_sequence(
    fresh_db: str, admin: psycopg.Connection, make_role: MakeRole
) -> None:
    pgsolo.migrate(admin)
    role, connect = make_role()
    with pytest.raises(InsufficientPrivilegeError) as denied:
        pgsolo.session_lock(connect(), "fenced", fencing=True).acquire()
    assert denied.value.needs[1:] == (
        f'GRANT USAGE ON SCHEMA pgsolo TO "{role}"',
        f'GRANT USAGE ON SEQUENCE pgsolo.fencing_token_seq TO "{role}"',
    )
    for statement in denied.value.needs[1:]:  # EXECUTE is PUBLIC's already
        admin.execute(statement.encode())
    lock = pgsolo.session_lock(connect(), "fenced", fencing=True)
    assert lock.acquire() is True
    assert (lock.token or 0) >= 1
    lock.release()
    # A leader needs no more: without the privileges on pgsolo.leader_terms its term's
    # start is simply not recorded (the monitor shows a bound).
    with pgsolo.leader(role_dsn(fresh_db, role), "fenced") as term:
        assert term.token is not None
        assert not term.lost
    assert admin.execute("SELECT count(*) FROM pgsolo.leader_terms").fetchone() == (0,)


# -- (b) jobs, (c) operation keys: pgsolo migrate --grant-to --------------------------------


def test_a_job_with_the_ledger_is_refused_before_its_work_then_runs_once_granted(
    fresh_db: str, admin: psycopg.Connection, make_role: MakeRole
) -> None:
    pgsolo.migrate(admin)
    role, _ = make_role()
    app_dsn = role_dsn(fresh_db, role)
    ran: list[str] = []

    def work(conn: Any) -> str:
        ran.append("ran")
        return "done"

    for options in ({"record": True}, {"period": "day"}):
        with pytest.raises(InsufficientPrivilegeError) as denied:
            pgsolo.run_job(app_dsn, "settle", work, **options)
        assert ran == []
        assert f"--grant-to {role}" in str(denied.value)
    grant(admin, denied.value)  # period='s: it may not write the ledger yet
    assert pgsolo.run_job(app_dsn, "settle", work, period="day").outcome == "completed"
    assert (
        pgsolo.run_job(app_dsn, "settle", work, period="day").reason == "already-done-this-period"
    )
    with pytest.raises(InsufficientPrivilegeError):
        pgsolo.run_job(app_dsn, "settle", work, record=True)
    assert ran == ["ran"]


def test_migrate_grant_to_gives_exactly_the_least_privileges(
    fresh_db: str, admin: psycopg.Connection, make_role: MakeRole
) -> None:
    role, connect = make_role()
    assert pgsolo.migrate(admin, grant_to=[role])  # the first run: created and granted
    assert privileges(admin, role) == {
        ("schema_migrations", "SELECT"),
        ("job_runs", "SELECT"),
        ("job_runs", "INSERT"),
        ("job_runs_id_seq", "USAGE"),
        ("job_periods", "SELECT"),
        ("job_periods", "INSERT"),
        ("operations", "SELECT"),
        ("operations", "INSERT"),
        ("operations", "UPDATE"),
        ("fencing_token_seq", "USAGE"),
        ("leader_terms", "SELECT"),
        ("leader_terms", "INSERT"),
        ("leader_terms", "UPDATE"),
    }
    assert admin.execute("SELECT has_schema_privilege(%s, 'pgsolo', 'USAGE')", (role,)).fetchone()
    app_dsn = role_dsn(fresh_db, role)
    done = pgsolo.run_job(app_dsn, "nightly", lambda conn: 1, record=True, period="day")
    assert done.outcome == "completed"
    holder = connect()
    with pgsolo.session_lock(holder, "nightly"):  # a busy skip reads the ledger back
        assert pgsolo.run_job(app_dsn, "other", lambda c: 1, record=True).outcome == "completed"
    assert [row["job"] for row in pgsolo.history(connect())] == ["other", "nightly"]
    with pgsolo.leader(app_dsn, "scheduler") as term:  # its term's start is recorded
        recorded = admin.execute("SELECT pid FROM pgsolo.leader_terms WHERE name = 'scheduler'")
        assert recorded.fetchone() == (term.backend_pid,)
    once = pgsolo.run_once(connect(), "invoice-42", lambda ctx: {"sent": True})
    assert once.outcome == "ran"
    assert pgsolo.run_once(connect(), "invoice-42", lambda ctx: 0).outcome == "already-succeeded"
    with pytest.raises(psycopg.errors.InsufficientPrivilege):  # and nothing more
        connect().execute("DELETE FROM pgsolo.job_runs")
    assert pgsolo.migrate(admin, grant_to=[role]) == []  # idempotent


def test_run_once_refused_reading_or_writing_runs_nothing(
    fresh_db: str, admin: psycopg.Connection, make_role: MakeRole
) -> None:
    pgsolo.migrate(admin)
    role, connect = make_role()
    ran: list[int] = []
    with pytest.raises(InsufficientPrivilegeError) as denied:
        pgsolo.run_once(connect(), "op-1", lambda ctx: ran.append(1))
    assert denied.value.needs == (
        f'GRANT USAGE ON SCHEMA pgsolo TO "{role}"',
        f'GRANT SELECT, INSERT, UPDATE ON TABLE pgsolo.operations TO "{role}"',
    )
    admin.execute(denied.value.needs[0].encode())
    admin.execute(f'GRANT SELECT ON pgsolo.operations TO "{role}"'.encode())
    conn = connect()
    with pytest.raises(InsufficientPrivilegeError):  # it may read, not start an attempt
        pgsolo.run_once(conn, "op-1", lambda ctx: ran.append(1))
    assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    assert admin.execute("SELECT count(*) FROM pgsolo.operations").fetchone() == (0,)
    grant(admin, denied.value)
    assert pgsolo.run_once(conn, "op-1", lambda ctx: ran.append(1)).outcome == "ran"
    assert ran == [1]


@pytest.mark.parametrize("name", ["", "x" * 64, "public", "a\0b", "ab\udcffc"])
def test_grant_to_a_name_that_cannot_be_a_role_is_refused_before_any_sql(name: str) -> None:
    with pytest.raises(InvalidArgumentError):
        pgsolo.migrate(object(), grant_to=[name])  # type: ignore[arg-type]


@pytest.mark.parametrize("grant_to", [None, 5])
def test_grant_to_that_is_no_list_of_roles_is_refused_before_any_sql(grant_to: object) -> None:
    """Guards the typed error: a bare TypeError (None is not iterable) came out."""
    with pytest.raises(InvalidArgumentError, match="grant_to"):
        pgsolo.migrate(object(), grant_to=grant_to)  # type: ignore[arg-type]


def test_grant_to_a_role_given_twice_is_granted_once() -> None:
    """A role named twice (``--grant-to app --grant-to app``) was reported twice."""
    assert check_roles(["app", "ops", "app"]) == ("app", "ops")


def test_grant_to_any_role_name_is_quoted(admin: psycopg.Connection, make_role: MakeRole) -> None:
    role, connect = make_role('app "röle"; DROP TABLE x --')
    pgsolo.migrate(admin, grant_to=[role])
    assert pgsolo.run_once(connect(), "quoted", lambda ctx: 1).outcome == "ran"


def test_grant_to_a_missing_role_migrates_nothing(admin: psycopg.Connection) -> None:
    with pytest.raises(InvalidArgumentError, match="no such role"):
        pgsolo.migrate(admin, grant_to=["pgsolo_no_such_role"])
    assert schema_version(admin) == 0


def test_migrate_as_a_role_without_create_says_so(
    fresh_db: str, admin: psycopg.Connection, make_role: MakeRole
) -> None:
    admin.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")  # older servers' default
    _, connect = make_role()
    with pytest.raises(InsufficientPrivilegeError) as denied:
        pgsolo.migrate(connect())
    assert denied.value.needs[0].startswith("GRANT CREATE ON DATABASE")
    grant(admin, denied.value)
    assert pgsolo.migrate(connect())


def test_migrate_on_a_schema_another_role_owns_names_that_role(
    fresh_db: str, admin: psycopg.Connection, make_role: MakeRole
) -> None:
    """Regression: with CREATE on the database already, the error's ``needs`` still said
    GRANT CREATE ON DATABASE, which changed nothing: schema pgsolo existed, and only its
    owner can create and alter pgsolo's tables in it. The error names the owner to run it
    as, and grants nothing, since only membership in that role would do."""
    migrate_to(admin, 1)
    role, connect = make_role()
    admin.execute(
        pgsql.SQL("GRANT CREATE ON DATABASE {} TO {}").format(
            pgsql.Identifier(admin.info.dbname), pgsql.Identifier(role)
        )
    )
    owner = admin.execute("SELECT current_user").fetchone()
    assert owner is not None
    with pytest.raises(InsufficientPrivilegeError) as denied:
        pgsolo.migrate(connect())
    assert f"belongs to role {owner[0]!r}" in str(denied.value)
    assert f"run pgsolo migrate as {owner[0]!r}" in str(denied.value)
    assert denied.value.needs == ()
    assert schema_version(admin) == 1
    assert pgsolo.migrate(admin)


def test_cli_migrate_grant_to_and_a_job_as_the_app_role(fresh_db: str, make_role: MakeRole) -> None:
    role, _ = make_role()
    app_dsn = role_dsn(fresh_db, role)
    assert pgsolo_cli("migrate", "--dsn", fresh_db).returncode == 0  # by its owner
    refused = pgsolo_cli("run", "--dsn", app_dsn, "--key", "k", "--record", "--", "true")
    assert refused.returncode == 1, refused.stderr
    assert "InsufficientPrivilege" not in refused.stderr
    assert f"--grant-to {role}" in refused.stderr
    done = pgsolo_cli("migrate", "--dsn", fresh_db, "--grant-to", role)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        done.stdout.splitlines()[0],
        f"granted pgsolo's privileges to {role}",
    ]
    assert done.stdout.startswith("up to date")
    as_json = pgsolo_cli("migrate", "--dsn", fresh_db, "--grant-to", role, "--json")
    assert json_document(as_json.stdout)["granted_to"] == [role]
    ran = pgsolo_cli("run", "--dsn", app_dsn, "--key", "k", "--record", "--", "true")
    assert ran.returncode == 0, ran.stderr


def test_cli_run_json_says_a_missing_privilege_where_its_document_goes(
    fresh_db: str, make_role: MakeRole
) -> None:
    """`pgsolo run --json` refused a privilege: its document is a `pgsolo.run/1` (outcome
    null) where every run document goes, the last line on stderr, never on stdout, which
    is COMMAND's."""
    role, _ = make_role()
    assert pgsolo_cli("migrate", "--dsn", fresh_db).returncode == 0
    app_dsn = role_dsn(fresh_db, role)
    refused = pgsolo_cli("run", "--dsn", app_dsn, "--key", "k", "--record", "--json", "--", "true")
    assert refused.returncode == 1, refused.stderr
    assert refused.stdout == ""
    doc = json_document(refused.stderr)
    assert (doc["schema"], doc["outcome"], doc["exit_code"]) == ("pgsolo.run/1", None, 1)
    assert doc["reason"] == doc["error"]["code"] == "insufficient-privilege"
    assert f"--grant-to {role}" in doc["error"]["message"]
    assert doc["database"] is not None  # it connected before it was refused


@pytest.mark.parametrize("command", [["history"], ["migrate"], ["prune", "--older-than", "1d"]])
def test_every_commands_json_error_says_a_missing_privilege_by_its_code(
    fresh_db: str, make_role: MakeRole, command: list[str]
) -> None:
    """Guards docs/cli.md's `error.code` vocabulary: `history` and `migrate` said
    `failed` for a privilege the role lacks (only `prune` said
    `insufficient-privilege`)."""
    role, _ = make_role()
    assert pgsolo_cli("migrate", "--dsn", fresh_db).returncode == 0
    refused = pgsolo_cli(*command, "--dsn", role_dsn(fresh_db, role), "--json")
    assert refused.returncode == 1, refused.stderr
    doc = json_document(refused.stdout)
    assert (doc["schema"], doc["error"]["code"]) == ("pgsolo.error/1", "insufficient-privilege")


# -- (d) the monitor, (e) terminate ---------------------------------------------------------


def test_the_monitor_sees_other_roles_locks_but_not_their_activity(
    admin: psycopg.Connection, make_role: MakeRole
) -> None:
    """pg_locks is every role's to read; pg_stat_activity hides the state and query of
    other roles' backends unless the reader is a member of pg_read_all_stats."""
    role, connect = make_role()
    _, other = make_role()
    holder = other()
    holder.execute("SET application_name = 'other-worker'")
    assert pgsolo.session_lock(holder, "watched").acquire()
    pid = holder.info.backend_pid
    (row,) = pgsolo.advisory_locks(connect())
    assert (row.pid, row.application_name, row.granted) == (pid, "other-worker", True)
    assert (row.state, row.query) == (None, "<insufficient privilege>")
    checks = {c.name: c for c in pgsolo.doctor(connect())}
    assert checks["visibility"].status == "warn"
    assert f"pid {pid} ('other-worker'" in checks["visibility"].detail
    assert checks["visibility"].advice.endswith(f'GRANT pg_read_all_stats TO "{role}"')
    admin.execute(checks["visibility"].advice.split(": ", 1)[1].encode())
    (row,) = pgsolo.advisory_locks(connect())
    assert row.state == "idle"
    assert {c.name: c for c in pgsolo.doctor(connect())}["visibility"].status == "ok"


def test_the_monitor_names_other_roles_sessions_without_an_application_name(
    make_role: MakeRole,
) -> None:
    """Regression: a session of another role holding a lock without an application_name
    was left out of the application-name check when the reader could not see its state,
    which then said that all had one; PostgreSQL shows every role its application_name."""
    _, connect = make_role()
    _, other = make_role()
    holder = other()
    holder.execute("SET application_name = ''")
    assert pgsolo.session_lock(holder, "anonymous").acquire()
    check = {c.name: c for c in pgsolo.doctor(connect())}["application-name"]
    assert check.status == "warn"
    assert f"pid {holder.info.backend_pid} (no application_name" in check.detail


def test_locks_and_terminate_need_no_usage_on_schema_pgsolo(
    fresh_db: str, make_role: MakeRole
) -> None:
    """Once `migrate` has run, the monitor names keys from the ledger: a role without
    USAGE on schema pgsolo (docs/security.md asks none for `locks` and `terminate`) got
    a raw "permission denied for schema pgsolo", exit 1. The names are best effort."""
    assert pgsolo_cli("migrate", "--dsn", fresh_db).returncode == 0
    role, connect = make_role()
    holder = connect()
    assert pgsolo.session_lock(holder, "watched-without-usage").acquire()
    pid = holder.info.backend_pid
    (row,) = pgsolo.advisory_locks(connect(), from_ledger=True)
    assert (row.pid, row.granted) == (pid, True)
    dsn = role_dsn(fresh_db, role)
    shown = pgsolo_cli("locks", "--dsn", dsn, "--json")
    assert shown.returncode == 0, shown.stderr
    assert [lock["pid"] for lock in json_document(shown.stdout)["locks"]] == [pid]
    ended = pgsolo_cli("terminate", str(pid), "--yes", "--dsn", dsn)
    assert ended.returncode == 0, ended.stderr
    assert pgsolo.advisory_locks(connect(), from_ledger=True) == []


def test_terminate_needs_the_same_role_or_pg_signal_backend(
    admin: psycopg.Connection, make_role: MakeRole
) -> None:
    role, connect = make_role()
    _, other = make_role()
    mine, theirs = connect(), other()
    assert pgsolo.terminate_backend(connect(), mine.info.backend_pid) is True
    with pytest.raises(InsufficientPrivilegeError) as denied:
        pgsolo.terminate_backend(connect(), theirs.info.backend_pid)
    assert denied.value.needs == (f'GRANT pg_signal_backend TO "{role}"',)
    with pytest.raises(InsufficientPrivilegeError):  # a superuser's: never
        pgsolo.terminate_backend(connect(), admin.info.backend_pid)
    grant(admin, denied.value)
    assert pgsolo.terminate_backend(connect(), theirs.info.backend_pid) is True


def led_from_a_recorded_start(dsn: str, connect: Callable[[], psycopg.Connection]) -> bool:
    """Whether a leader's term shows its recorded start (its lack is silent: a bound)."""
    with pgsolo.leader(dsn, "l", fencing=False) as term:
        (lock,) = pgsolo.advisory_locks(connect(), key=term.key)
        return lock.since_source == "term_start"


FEATURE_USES: dict[str, Callable[[str, Callable[[], psycopg.Connection]], object]] = {
    "fencing": lambda dsn, connect: pgsolo.session_lock(connect(), "f", fencing=True).acquire(),
    "leader": led_from_a_recorded_start,
    "record": lambda dsn, connect: pgsolo.run_job(dsn, "r", lambda c: 1, record=True).outcome,
    "period": lambda dsn, connect: pgsolo.run_job(dsn, "p", lambda c: 1, period="day").outcome,
    "once": lambda dsn, connect: pgsolo.run_once(connect(), "o", lambda ctx: 1).outcome,
    "history": lambda dsn, connect: pgsolo.history(connect()) == [],
}
FEATURE_RESULTS = {
    "fencing": True,
    "leader": True,
    "record": "completed",
    "period": "completed",
    "once": "ran",
    "history": True,
}


def needs(feature: str) -> set[tuple[str, str]]:
    return {(p, target) for ps, target in FEATURE_PRIVILEGES[feature] for p in ps.split(", ")}


@pytest.mark.parametrize("feature", sorted(FEATURE_USES))
def test_each_feature_works_with_exactly_its_own_grants(
    feature: str, fresh_db: str, admin: psycopg.Connection, make_role: MakeRole
) -> None:
    assert set(FEATURE_USES) == set(FEATURE_PRIVILEGES)
    pgsolo.migrate(admin)
    role, connect = make_role()
    for statement in sql.grants(role, (feature,)):
        admin.execute(statement.encode())
    dsn = role_dsn(fresh_db, role)
    assert FEATURE_USES[feature](dsn, connect) == FEATURE_RESULTS[feature]
    others = [f for f in FEATURE_USES if not needs(f) <= needs(feature)]
    for other in others:  # and the others are refused, by pgsolo
        if other == "leader":  # a term whose start cannot be recorded: led all the same
            assert FEATURE_USES[other](dsn, connect) is False
            continue
        with pytest.raises(InsufficientPrivilegeError):
            FEATURE_USES[other](dsn, connect)


def test_the_ledger_and_the_log_never_show_the_connection_password(
    fresh_db: str, admin: psycopg.Connection, make_role: MakeRole, caplog: pytest.LogCaptureFixture
) -> None:
    role, _ = make_role()
    password = "ledger-sekret-9"  # noqa: S105 - a throwaway role's, on purpose
    admin.execute(
        pgsql.SQL("ALTER ROLE {} PASSWORD {}").format(
            pgsql.Identifier(role), pgsql.Literal(password)
        )
    )
    pgsolo.migrate(admin, grant_to=[role])
    secret_dsn = make_conninfo(fresh_db, user=role, password=password)

    def fails(conn: Any) -> None:
        raise RuntimeError(f"could not reach {secret_dsn}")

    with pytest.raises(RuntimeError):  # the work's own exception, to its caller
        pgsolo.run_job(secret_dsn, "leaky", fails, record=True)
    (error,) = admin.execute("SELECT error FROM pgsolo.job_runs").fetchone() or ("",)
    assert "could not reach" in error
    assert password not in error
    (line,) = [r.getMessage() for r in caplog.records if "job failed" in r.getMessage()]
    assert "could not reach" in line
    assert password not in line


def test_the_docs_grant_statements_are_migrate_grant_to() -> None:
    page = (Path(__file__).parents[2] / "docs" / "security.md").read_text(encoding="utf-8")
    block = page.split("```sql\n", 1)[1].split("```", 1)[0]
    assert block.splitlines() == [f"{statement};" for statement in sql.grants("app")]
