"""``pgsolo migrate``, run for real: up to date the second time, and four processes at once
apply the migrations exactly once.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import psycopg

from _support import Connect, json_document, pgsolo_cli
from pgsolo.schema import MIGRATIONS

ALL_VERSIONS = [version for version, _ in MIGRATIONS]  # what a first migrate applies


def test_migrate_twice_is_up_to_date_the_second_time(migrated: str) -> None:
    again = pgsolo_cli("migrate", "--dsn", migrated)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"up to date: pgsolo schema version {ALL_VERSIONS[-1]}")
    as_json = pgsolo_cli("migrate", "--dsn", migrated, "--json")
    assert as_json.returncode == 0
    assert json_document(as_json.stdout)["applied"] == []


def test_concurrent_migrate_from_four_processes(fresh_db: str, connect: Connect) -> None:
    with ThreadPoolExecutor(4) as pool:
        results = list(
            pool.map(lambda _: pgsolo_cli("migrate", "--dsn", fresh_db, "--json"), range(4))
        )
    assert [r.returncode for r in results] == [0, 0, 0, 0], [r.stderr for r in results]
    applied = sorted(json_document(r.stdout)["applied"] for r in results)
    assert applied == [[], [], [], ALL_VERSIONS]  # exactly one of them did the work
    conn = psycopg.connect(fresh_db, autocommit=True)
    with conn:
        versions = conn.execute("SELECT version FROM pgsolo.schema_migrations").fetchall()
    assert sorted(v for (v,) in versions) == ALL_VERSIONS
