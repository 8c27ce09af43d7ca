"""pgsolo's tables through Django's migrations: the app ``pgsolo.django`` in a real project
(``tests/django_project``), migrated by ``python manage.py migrate`` processes, each test in
a database of its own (``fresh_db``); roles made for a test as ``security/`` makes them.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from datetime import datetime
from importlib import resources
from pathlib import Path

import psycopg
import pytest

import pgsolo
from _support import MakeRole, manage, new_role, pgsolo_cli, privileges, role_dsn
from pgsolo.schema import LATEST_VERSION, migrate_to, schema_version

# pgsolo's own migrations, NNNN_what.sql: the Django app has one of each name.
VERSIONS = sorted(
    entry.name.removesuffix(".sql")
    for entry in resources.files("pgsolo.schema").joinpath("migrations").iterdir()
    if entry.name.endswith(".sql")
)
SETTLE = "django:jobsapp:settle"  # the ledger's name of the project's settle command


def migrated(dsn: str, *args: str, **env: str) -> str:
    """``manage.py migrate ARGS``, which must succeed; its output."""
    done = manage(dsn, "migrate", *args, **env)
    assert done.returncode == 0, done.stderr
    return done.stdout


def shown(dsn: str) -> dict[str, bool]:
    """What ``manage.py showmigrations pgsolo`` lists: each migration, and whether it is
    applied."""
    done = manage(dsn, "showmigrations", "pgsolo")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "pgsolo"
    return {line[5:]: line.startswith(" [X] ") for line in lines[1:]}


def versions(dsn: str) -> dict[int, datetime]:
    """Each version in ``pgsolo.schema_migrations``, and when it was applied."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT version, applied_at FROM pgsolo.schema_migrations")
        return dict(rows.fetchall())


def version(dsn: str) -> int:
    with psycopg.connect(dsn) as conn:
        return schema_version(conn)


def recorded(dsn: str) -> list[str]:
    """The migrations of the app ``pgsolo`` in Django's ``django_migrations``."""
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT name FROM django_migrations WHERE app = 'pgsolo'")
        return sorted(name for (name,) in rows)


# -- installing and upgrading --------------------------------------------------------------


def test_importing_the_module_needs_neither_django_nor_its_settings() -> None:
    """Guards the move of ``pgsolo/django.py`` into a package that is also a Django app: a
    command's module imports ``pgsolo.django`` before Django is set up."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, pgsolo.django as d; d.singleton_command()(lambda self: None);"
            " print(sorted(m for m in sys.modules if m.split('.')[0] == 'django'))",
        ],
        env={k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr


def test_the_plan_is_one_migration_per_version_of_pgsolos_schema(fresh_db: str) -> None:
    """Guards a pgsolo migration without its Django one: ``manage.py migrate`` would stop a
    version short, and a database ``pgsolo migrate`` upgraded would be ahead of Django's."""
    plan = migrated(fresh_db, "--plan").splitlines()

    assert plan[0] == "Planned operations:"
    steps = [(plan[i], plan[i + 1].strip()) for i in range(1, len(plan), 2)]
    assert steps == [
        (f"pgsolo.{name}", f"Raw Python operation -> pgsolo's schema to version {number}")
        for number, name in enumerate(VERSIONS, 1)
    ]
    assert len(VERSIONS) == LATEST_VERSION
    assert version(fresh_db) == 0  # a plan runs nothing


def test_migrate_installs_pgsolos_tables_and_again_does_nothing(fresh_db: str) -> None:
    out = migrated(fresh_db)

    assert [line for line in out.splitlines() if "Applying" in line] == [
        f"  Applying pgsolo.{name}... OK" for name in VERSIONS
    ]
    assert version(fresh_db) == LATEST_VERSION
    assert shown(fresh_db) == dict.fromkeys(VERSIONS, True)
    first = versions(fresh_db)

    assert "No migrations to apply." in migrated(fresh_db)
    assert versions(fresh_db) == first
    assert shown(fresh_db) == dict.fromkeys(VERSIONS, True)


def test_migrate_upgrades_a_version_at_a_time(fresh_db: str) -> None:
    """A release of pgsolo with new versions is an upgrade: each Django migration brings
    the tables to its own version, and no further."""
    migrated(fresh_db, "pgsolo", VERSIONS[2])
    assert version(fresh_db) == 3
    assert shown(fresh_db) == {name: number <= 3 for number, name in enumerate(VERSIONS, 1)}
    before = versions(fresh_db)

    migrated(fresh_db)

    after = versions(fresh_db)
    assert sorted(after) == list(range(1, LATEST_VERSION + 1))
    assert {v: after[v] for v in before} == before  # 1 to 3 not applied again


def test_a_database_pgsolo_migrate_made_is_taken_as_it_is(fresh_db: str) -> None:
    done = pgsolo_cli("migrate", "--dsn", fresh_db)
    assert done.returncode == 0, done.stderr
    made = versions(fresh_db)

    out = migrated(fresh_db)

    assert out.count("... OK") == len(VERSIONS)  # recorded on Django's books
    assert versions(fresh_db) == made  # and nothing applied again
    assert recorded(fresh_db) == VERSIONS


def test_a_database_an_older_pgsolo_made_gets_only_the_versions_it_lacks(fresh_db: str) -> None:
    with psycopg.connect(fresh_db) as conn:
        assert migrate_to(conn, 2) == [1, 2]
        conn.commit()
    made = versions(fresh_db)

    migrated(fresh_db)

    after = versions(fresh_db)
    assert sorted(after) == list(range(1, LATEST_VERSION + 1))
    assert {v: after[v] for v in made} == made


def test_migrating_back_is_refused_and_leaves_the_tables(fresh_db: str) -> None:
    """pgsolo has no downgrade: its tables hold the ledger and the operations' results."""
    migrated(fresh_db)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        assert pgsolo.run_once(conn, "kept", lambda ctx: 1).outcome == "ran"

    done = manage(fresh_db, "migrate", "pgsolo", "zero")

    assert done.returncode == 1
    assert f"pgsolo.{VERSIONS[-1]} is not reversible" in done.stderr
    assert "IrreversibleError" in done.stderr
    assert shown(fresh_db) == dict.fromkeys(VERSIONS, True)
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        assert schema_version(conn) == LATEST_VERSION
        assert pgsolo.run_once(conn, "kept", lambda ctx: 2).result == 1


# -- other databases -----------------------------------------------------------------------


def test_a_database_of_another_vendor_records_the_migrations_and_holds_nothing(
    fresh_db: str, tmp_path: Path
) -> None:
    """Each migration runs on the database Django migrates (``--database``), never on
    ``default``; on SQLite it does nothing, as ``django.contrib.postgres``' operations do."""
    lite = tmp_path / "lite.sqlite3"

    out = migrated(fresh_db, "--database", "lite", PGSOLO_TEST_SQLITE=str(lite))

    assert out.count("... OK") == len(VERSIONS)
    with sqlite3.connect(lite) as conn:
        names = conn.execute("SELECT name FROM django_migrations WHERE app = 'pgsolo'")
        assert sorted(name for (name,) in names) == VERSIONS
        tables = conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        assert {name for (name,) in tables} <= {"django_migrations", "sqlite_sequence"}
    assert version(fresh_db) == 0  # default: untouched


def test_a_router_that_refuses_pgsolo_keeps_its_tables_out(fresh_db: str) -> None:
    """Django's router decides, as for any ``RunPython``: the migrations are recorded, and
    nothing of pgsolo's is created (docs/django.md says so)."""
    out = migrated(fresh_db, PGSOLO_TEST_NO_PGSOLO_IN="default")

    assert out.count("... OK") == len(VERSIONS)
    assert recorded(fresh_db) == VERSIONS
    assert version(fresh_db) == 0


# -- the least privileges ------------------------------------------------------------------


def settle(dsn: str, op: str) -> subprocess.CompletedProcess[str]:
    """The project's ``settle`` command: a job of the ledger that settles ``op`` once."""
    return manage(dsn, "settle", "--op", op)


def test_grant_to_setting_gives_the_role_what_pgsolo_migrate_grants(
    fresh_db: str, admin: psycopg.Connection, make_role: MakeRole
) -> None:
    """``PGSOLO_GRANT_TO``: the role may use every feature's tables through Django (a job
    of the ledger, ``run_once``), with exactly ``pgsolo migrate --grant-to``'s grants."""
    (app, _), (other, _) = make_role(), make_role()

    migrated(fresh_db, PGSOLO_TEST_GRANT_TO=app)

    pgsolo.migrate(admin, grant_to=[other])
    assert ("operations", "UPDATE") in privileges(admin, app, schema_usage=True)
    assert privileges(admin, app, schema_usage=True) == privileges(admin, other, schema_usage=True)
    app_dsn = role_dsn(fresh_db, app)
    ran, again = settle(app_dsn, "invoice-7"), settle(app_dsn, "invoice-7")
    assert (ran.returncode, ran.stdout.strip()) == (0, "ran 1 invoice-7"), ran.stderr
    assert (again.returncode, again.stdout.strip()) == (0, "already-succeeded 1 invoice-7")
    outcomes = admin.execute("SELECT outcome FROM pgsolo.job_runs WHERE job = %s", (SETTLE,))
    assert outcomes.fetchall() == [("completed",), ("completed",)]


def test_a_role_that_does_not_exist_stops_migrate_at_the_last_version(
    fresh_db: str, make_role: MakeRole
) -> None:
    """The roles are granted by the migration of the latest version, when every table they
    are granted is there: a missing one undoes that migration alone, and once it exists
    ``manage.py migrate`` finishes."""
    role = new_role()

    done = manage(fresh_db, "migrate", PGSOLO_TEST_GRANT_TO=role)

    assert done.returncode == 1
    assert "no such role in" in done.stderr
    # Regression: it said "nothing was migrated", pgsolo migrate's words (one transaction).
    assert f"version {LATEST_VERSION} was rolled back" in done.stderr
    assert "the migrations before it stay applied" in done.stderr
    assert shown(fresh_db) == {name: name != VERSIONS[-1] for name in VERSIONS}
    assert version(fresh_db) == LATEST_VERSION - 1
    make_role(role)
    migrated(fresh_db, PGSOLO_TEST_GRANT_TO=role)
    assert version(fresh_db) == LATEST_VERSION
    ran = settle(role_dsn(fresh_db, role), "op")
    assert (ran.returncode, ran.stdout.strip()) == (0, "ran 1 op"), ran.stderr


@pytest.mark.parametrize(
    ("setting", "says"),
    [("PUBLIC", "PUBLIC is every role"), ("", "a role name is non-empty text")],
)
def test_a_bad_setting_is_refused_before_any_sql(fresh_db: str, setting: str, says: str) -> None:
    done = manage(fresh_db, "migrate", PGSOLO_TEST_GRANT_TO=setting)

    assert done.returncode == 1
    assert f"InvalidArgumentError: settings.PGSOLO_GRANT_TO: grant_to: {says}" in done.stderr
    assert recorded(fresh_db) == []
    assert version(fresh_db) == 0


def test_pgsolo_grant_grants_a_role_that_came_after_the_tables(
    fresh_db: str, admin: psycopg.Connection, make_role: MakeRole
) -> None:
    migrated(fresh_db)
    (app, _), (other, _) = make_role(), make_role()
    app_dsn = role_dsn(fresh_db, app)
    refused = settle(app_dsn, "invoice-8")
    assert refused.returncode == 1
    assert f"needs a privilege that role {app!r} lacks" in refused.stderr
    assert f"python manage.py pgsolo_grant {app}" in refused.stderr  # the advice says how

    done = manage(fresh_db, "pgsolo_grant", app)

    assert (done.returncode, done.stdout.strip()) == (
        0,
        f"granted pgsolo's privileges in database 'default' to {app}",
    ), done.stderr
    pgsolo.migrate(admin, grant_to=[other])
    assert privileges(admin, app, schema_usage=True) == privileges(admin, other, schema_usage=True)
    ran = settle(app_dsn, "invoice-8")
    assert (ran.returncode, ran.stdout.strip()) == (0, "ran 1 invoice-8"), ran.stderr


def test_pgsolo_grant_refuses_what_it_cannot_grant_with_the_usage_code(
    fresh_db: str, make_role: MakeRole, tmp_path: Path
) -> None:
    role, _ = make_role()
    refusals = [
        (manage(fresh_db, "pgsolo_grant", role), "are at version 0, and this pgsolo's at"),
        (manage(fresh_db, "pgsolo_grant", "public"), "PUBLIC is every role"),
        (
            manage(
                fresh_db,
                "pgsolo_grant",
                role,
                "--database",
                "lite",
                PGSOLO_TEST_SQLITE=str(tmp_path / "lite.sqlite3"),
            ),
            "connection 'lite' is sqlite",
        ),
        (manage(fresh_db, "pgsolo_grant", role, "--database", "nope"), "using='nope'"),
    ]
    migrated(fresh_db)
    refusals.append((manage(fresh_db, "pgsolo_grant", "nobody_here"), "no such role"))

    for done, says in refusals:
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.splitlines()
        assert line.startswith("CommandError: pgsolo: ")
        assert says in line
    with psycopg.connect(fresh_db) as conn:
        granted = conn.execute(
            "SELECT count(*) FROM information_schema.role_table_grants WHERE grantee = %s",
            (role,),
        )
        assert granted.fetchone() == (0,)
