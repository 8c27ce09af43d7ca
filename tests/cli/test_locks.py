"""``pgsolo locks``, run for real in subprocesses: the table and JSON, with names and the
wait chain, an empty database, bad arguments, a key given by name, and a semaphore shown as
one row (given with ``--semaphore``, or told by its sessions' ``application_name``).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from _support import DEADLINE, Connect, eventually, json_document, pgsolo_in_background, run_cli
from _support import run_cli as pgsolo
from pgsolo import PgsoloError, semaphore
from pgsolo.keys import Key, derive_int64, semaphore_keys, semaphore_session_name

CLOSED = "postgresql://nobody@127.0.0.1:1/nowhere?connect_timeout=2"


def test_locks_table_and_json_with_names_and_the_wait_chain(
    fresh_db: str, tmp_path: Path, observer: object
) -> None:
    registry = tmp_path / "locks.toml"
    registry.write_text("[locks]\nnightly-report = [42, -1001]\n", encoding="utf-8")
    a = psycopg.connect(fresh_db, autocommit=True, application_name="worker-a")
    b = psycopg.connect(fresh_db, autocommit=True, application_name="worker-b")
    c = psycopg.connect(fresh_db, autocommit=True, application_name="worker-c")
    settle = derive_int64("daily-settlement")
    a.execute(f"SELECT pg_advisory_lock(42, -1001), pg_advisory_lock({settle})")
    b.execute("SET statement_timeout = 60000")
    c.execute("SET statement_timeout = 60000")
    b.execute("SELECT pg_advisory_lock(-5)")
    threads = [
        threading.Thread(target=_quietly, args=(b, "SELECT pg_advisory_lock(42, -1001)")),
        threading.Thread(target=_quietly, args=(c, "SELECT pg_advisory_lock_shared(-5)")),
    ]
    threads[0].start()
    eventually(lambda: observer.waiters(Key((42, -1001))), "b to wait")  # type: ignore[attr-defined]
    threads[1].start()
    eventually(lambda: observer.waiters(Key(-5)), "c to wait")  # type: ignore[attr-defined]
    pa, pb, pc = (conn.info.backend_pid for conn in (a, b, c))
    try:
        args = (
            "locks",
            "--dsn",
            fresh_db,
            "--registry",
            str(registry),
            "--name",
            "daily-settlement",
        )
        done = pgsolo(*args, "--wide")
        assert done.returncode == 0, done.stderr
        lines = done.stdout.splitlines()
        assert lines[0] == "3 held, 2 waiting: advisory locks in"
        del lines[1]  # where
        header = lines[1].split()
        assert header[:5] == ["KEY", "NAME", "MODE", "LIFETIME", "STATUS"]
        rows = [line.split() for line in lines[2:7]]
        # int64 keys in numeric order, then pairs; holders before waiters.
        assert rows[0][:5] == [str(settle), "daily-settlement", "exclusive", "session", "held"]
        assert [r[:4] for r in rows[1:3]] == [  # no name: that column is empty
            ["-5", "exclusive", "?", "held"],
            ["-5", "shared", "?", "waiting"],
        ]
        assert rows[3][:5] == ["42:-1001", "nightly-report", "exclusive", "session", "held"]
        assert rows[4][:5] == ["42:-1001", "nightly-report", "exclusive", "?", "waiting"]
        assert "worker-a" in lines[2]
        assert "worker-b" in lines[6]
        assert lines[-1].split() == [str(pc), "->", str(pb), "->", str(pa)]

        data = json_document(pgsolo(*args, "--json").stdout)
        assert data["wait_chains"] == [[pc, pb, pa]]
        waiting = [lock for lock in data["locks"] if not lock["granted"]]
        assert [(w["key"], w["pid"], w["blocked_by"], w["mode"]) for w in waiting] == [
            ("-5", pc, [pb], "shared"),
            ("42:-1001", pb, [pa], "exclusive"),
        ]
        assert all(w["since_source"] == "waitstart" for w in waiting)

        only = json_document(pgsolo(*args, "--key", "nightly-report", "--json").stdout)["locks"]
        assert [(lock["key"], lock["pid"]) for lock in only] == [("42:-1001", pa), ("42:-1001", pb)]
    finally:
        for conn in (a, b, c):
            conn.close()
        for thread in threads:
            thread.join(DEADLINE)


def _quietly(conn: psycopg.Connection, statement: str) -> None:
    with contextlib.suppress(psycopg.Error):
        conn.execute(statement)


def test_locks_in_an_empty_database_and_bad_arguments(fresh_db: str, tmp_path: Path) -> None:
    done = pgsolo("locks", "--dsn", fresh_db)
    assert (done.returncode, done.stdout.splitlines()[0][:19]) == (0, "0 held, 0 waiting: ")
    bad = tmp_path / "bad.toml"
    bad.write_text("[locks]\nx = 'not a key'\n", encoding="utf-8")
    for args in (
        ["--registry", str(bad)],
        ["--registry", str(tmp_path / "missing.toml")],
        ["--key", "1:99999999999"],
        ["--name", ""],
    ):
        done = pgsolo("locks", "--dsn", fresh_db, *args)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr.startswith("pgsolo locks: error: "), done.stderr


# -- found in review -----------------------------------------------------------------------


def test_locks_key_given_by_name_is_shown_with_that_name(connect: Connect, dsn: str) -> None:
    """`pgsolo locks --key review2-job` filters on the name's key but leaves the NAME
    column empty: the name the user typed is not used to label the rows it selected."""
    name = "review2-job-name"
    holder = connect()
    holder.execute(f"SELECT pg_advisory_lock({derive_int64(name)})")
    done = run_cli("locks", "--key", name, "--json", "--dsn", dsn)
    assert done.returncode == 0, done.stderr
    rows = json_document(done.stdout)["locks"]
    assert [row["key"] for row in rows] == [str(derive_int64(name))]
    assert rows[0]["name"] == name, rows[0]


def test_a_kept_lock_reads_at_80_columns_with_its_name_and_true_age(
    dsn: str, observer: object, tmp_path: Path
) -> None:
    """A real ``pgsolo run`` whose keeper beats every 0.2 s: ``pgsolo locks`` (no
    --name) names its key, dates it from before the beats, and shows no beat as its
    query, in rows that fit 80 columns (issue 15, item 5)."""
    name = f"nightly-{uuid.uuid4().hex[:8]}-" + "x" * 12  # longer than the LOCK column
    key = Key(derive_int64(name), name)
    started = time.monotonic()
    with pgsolo_in_background(
        "run", "--key", name, "--check-interval", "0.2", "--dsn", dsn, "--",
        sys.executable, "-c", "import time; time.sleep(60)",
    ):  # fmt: skip
        eventually(lambda: observer.holders(key), "pgsolo run to hold its key")  # type: ignore[attr-defined]
        time.sleep(3.0)  # a dozen beats: the holder's state_change is never older than 0.2 s
        done = run_cli("locks", "--dsn", dsn, env={"COLUMNS": "80"})
        # Read once that command ended: starting it took seconds on a busy machine.
        held_for = time.monotonic() - started
        as_json = run_cli("locks", "--key", str(key.value), "--json", "--dsn", dsn)
        wide = run_cli("locks", "--wide", "--dsn", dsn)
    assert done.returncode == 0, done.stderr
    assert all(len(line) <= 80 for line in done.stdout.splitlines()), done.stdout
    # Named without --name (its application_name says it), cut to the LOCK column.
    (row,) = [line for line in done.stdout.splitlines() if line.startswith(name[:21] + "~")]
    assert "(pgsolo keeper)" in row
    age = row.split()[-3]  # FOR: an upper bound, the session's age
    assert age.startswith("<="), row
    assert 2.5 <= float(age.removeprefix("<=").removesuffix("s")) <= held_for + 1
    (lock,) = json_document(as_json.stdout)["locks"]
    assert (lock["name"], lock["keeper"], lock["query"]) == (name, True, None)
    assert lock["since_source"] == "backend_start"
    assert lock["age_seconds"] >= 2.5
    assert "pg_backend_pid()" not in wide.stdout  # the beat is never shown as the query
    assert max(len(line) for line in wide.stdout.splitlines()) > 80  # --wide has it all


def test_keys_of_recorded_jobs_are_named_from_the_ledger(migrated: str, tmp_path: Path) -> None:
    """A key held by a session that does not say its name (a custom application_name) is
    named after the ledger's job that last ran with it, by ``pgsolo locks`` only."""
    from pgsolo.monitor import advisory_locks  # noqa: PLC0415

    job = f"report-{uuid.uuid4().hex[:8]}"
    pair = f"42:{uuid.uuid4().int % 2**31}"
    recorded = pgsolo(
        "run", "--key", pair, "--name", job, "--record", "--dsn", migrated, "--",
        sys.executable, "-c", "pass",
    )  # fmt: skip
    assert recorded.returncode == 0, recorded.stderr
    namespace, resource = pair.split(":")
    with psycopg.connect(migrated, autocommit=True, application_name="report-cron") as holder:
        holder.execute(f"SELECT pg_advisory_lock({namespace}, {resource})")
        (lock,) = json_document(pgsolo("locks", "--key", pair, "--json", "--dsn", migrated).stdout)[
            "locks"
        ]
        assert (lock["key"], lock["name"]) == (pair, job)
        with psycopg.connect(migrated, autocommit=True) as conn:
            (plain,) = advisory_locks(conn, key=Key.parse(pair))
        assert plain.name is None  # the library reads the ledger only when asked


# -- semaphores ---------------------------------------------------------------------------


def _slot_of(conn: psycopg.Connection, name: str, limit: int) -> int:
    """Take a slot of the semaphore ``name`` on ``conn``'s session (held until the
    connection closes) and say which."""
    held = semaphore(conn, name, limit=limit)
    assert held.acquire()
    assert held.slot is not None
    return held.slot


def _rows(done: subprocess.CompletedProcess[str], start: str) -> list[str]:
    """The lines of a successful ``pgsolo locks`` that start with ``start``."""
    assert done.returncode == 0, done.stderr
    return [line for line in done.stdout.splitlines() if line.startswith(start)]


def test_a_semaphore_given_with_its_limit_is_one_row_of_its_holders(fresh_db: str) -> None:
    """``--semaphore exports=3``: the slots two sessions hold are one row, ``exports
    (semaphore)``, ``2 of 3 held`` by both pids (by slot); ``--json`` keeps the slot locks,
    named after their slots, and adds the semaphore to ``semaphores``. Once full, a waiter
    shows in the row too (``3 of 3 held, 1 waiting``)."""
    conns = [
        psycopg.connect(fresh_db, autocommit=True, application_name=f"exporter-{i}")
        for i in range(4)
    ]
    a, b, c, waiter = conns
    slots = {conn.info.backend_pid: _slot_of(conn, "exports", 3) for conn in (a, b)}
    holders = sorted(slots, key=slots.__getitem__)  # by slot
    thread: threading.Thread | None = None
    try:
        args = ("locks", "--dsn", fresh_db, "--semaphore", "exports=3")
        done = pgsolo(*args, env={"COLUMNS": "100"})
        assert done.stdout.splitlines()[0] == "2 held, 0 waiting: advisory locks in"
        assert len(done.stdout.splitlines()) == 4  # the header, where, the columns, one row
        (row,) = _rows(done, "exports (semaphore)")
        assert row.split()[2:7] == ["2", "of", "3", "held", ",".join(map(str, holders))]
        assert "exporter-" not in row  # the holders' applications differ: none is shown
        (wide,) = _rows(pgsolo(*args, "--wide"), "")[3:]
        assert wide.split()[:9] == [
            "exports", "(semaphore)", "exclusive", "session", "2", "of", "3", "held",
            ",".join(map(str, holders)),
        ]  # fmt: skip

        doc = json_document(pgsolo(*args, "--json").stdout)
        assert doc["semaphores"] == [
            {
                "name": "exports",
                "limit": 3,
                "held": 2,
                "holders": [{"pid": pid, "slot": slots[pid]} for pid in holders],
                "waiting": [],
            }
        ]
        assert sorted((lock["pid"], lock["name"], lock["granted"]) for lock in doc["locks"]) == [
            (pid, f"pgsolo:semaphore:exports:{slots[pid]}", True) for pid in sorted(slots)
        ]
        # Without --semaphore nothing says whose slots these are: a row for each key.
        plain = pgsolo("locks", "--dsn", fresh_db)
        assert "(semaphore)" not in plain.stdout
        assert len(plain.stdout.splitlines()) == 5
        assert (
            json_document(pgsolo("locks", "--dsn", fresh_db, "--json").stdout)["semaphores"] == []
        )

        slots[c.info.backend_pid] = _slot_of(c, "exports", 3)
        thread = threading.Thread(target=_waits_for_a_slot, args=(waiter, "exports", 3))
        thread.start()

        def waiting() -> object:
            doc = json_document(pgsolo(*args, "--json").stdout)
            return doc if doc["semaphores"] and doc["semaphores"][0]["waiting"] else None

        doc = eventually(waiting, "the waiter for a slot in pgsolo locks --json")
        (use,) = doc["semaphores"]
        assert (use["held"], use["waiting"]) == (3, [waiter.info.backend_pid])
        assert [holder["pid"] for holder in use["holders"]] == sorted(slots, key=slots.__getitem__)

        def one_waiting() -> list[str] | None:
            lines = pgsolo(*args).stdout.splitlines()
            return lines if lines[0] == "3 held, 1 waiting: advisory locks in" else None

        lines = eventually(one_waiting, "the waiter in pgsolo locks")
        (row,) = [line for line in lines if line.startswith("exports (semaphore)")]
        assert row.split()[2:8] == ["3", "of", "3", "held,", "1", "waiting"]
        assert len(lines) == 4 + 2  # one row still, and the wait chain
    finally:
        for conn in conns:
            conn.close()
        if thread is not None:
            thread.join(DEADLINE)


def _waits_for_a_slot(conn: psycopg.Connection, name: str, limit: int) -> None:
    with (
        contextlib.suppress(psycopg.Error, PgsoloError),
        semaphore(conn, name, limit=limit, wait=30),
    ):
        pass


def test_a_semaphore_is_named_by_its_sessions_application_name(fresh_db: str) -> None:
    """Without --semaphore: a session named ``pgsolo:semaphore:imports/2`` (as pgsolo
    names those it opens for a slot) that holds a slot of ``imports`` makes the semaphore
    known, and every holder of its slots is in its row; a session that says so of a key
    that is no slot of that name (a forged or mistaken name) makes no semaphore."""
    told = psycopg.connect(fresh_db, autocommit=True, application_name="pgsolo:semaphore:imports/2")
    other = psycopg.connect(fresh_db, autocommit=True, application_name="importer")
    forged = psycopg.connect(
        fresh_db, autocommit=True, application_name=semaphore_session_name("forged", 3)
    )
    try:
        slots = {conn.info.backend_pid: _slot_of(conn, "imports", 2) for conn in (told, other)}
        key = semaphore_keys("imports-too", 1)[0]  # no slot of "forged"
        forged.execute(f"SELECT pg_advisory_lock({key.sql_args})")
        done = pgsolo("locks", "--dsn", fresh_db, env={"COLUMNS": "100"})
        assert done.stdout.splitlines()[0] == "3 held, 0 waiting: advisory locks in"
        (row,) = _rows(done, "imports (semaphore)")
        holders = sorted(slots, key=slots.__getitem__)
        assert row.split()[2:7] == ["2", "of", "2", "held", ",".join(map(str, holders))]
        (forged_row,) = _rows(done, key.text)  # its key, unnamed, on a row of its own
        assert forged_row.split()[1:3] == ["held", str(forged.info.backend_pid)]

        doc = json_document(pgsolo("locks", "--dsn", fresh_db, "--json").stdout)
        assert [(use["name"], use["limit"], use["held"]) for use in doc["semaphores"]] == [
            ("imports", 2, 2)
        ]
        names = {lock["pid"]: lock["name"] for lock in doc["locks"]}
        assert names == {
            **{pid: f"pgsolo:semaphore:imports:{slot}" for pid, slot in slots.items()},
            forged.info.backend_pid: None,
        }
    finally:
        for conn in (told, other, forged):
            conn.close()


@pytest.mark.parametrize(
    "given",
    [
        ["exports"],  # no limit
        ["exports="],
        ["exports=x"],
        ["exports=-1"],
        ["exports=0"],
        ["exports=1025"],
        ["exports=99999999999999999999"],
        ["=3"],  # no name
        ["x" * 513 + "=3"],
        ["exports=2", "--semaphore", "exports=3"],  # two limits
    ],
)
def test_bad_semaphore_arguments_are_refused_before_connecting(given: list[str]) -> None:
    """A bad ``--semaphore`` is a usage error (exit 2) before any connection is tried: the
    DSN given points nowhere, which would exit 69."""
    done = pgsolo("locks", "--dsn", CLOSED, "--semaphore", *given)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("pgsolo locks: error: --semaphore "), done.stderr
    as_json = pgsolo("locks", "--dsn", CLOSED, "--json", "--semaphore", *given)
    assert as_json.returncode == 2
    assert json_document(as_json.stdout)["error"]["code"] == "usage-error"


def test_a_semaphore_name_with_an_equals_sign_is_split_at_the_last_one(fresh_db: str) -> None:
    """``--semaphore a=b=2`` is the semaphore ``a=b`` of 2 slots."""
    with psycopg.connect(fresh_db, autocommit=True) as holder:
        slot = _slot_of(holder, "a=b", 2)
        doc = json_document(
            pgsolo("locks", "--dsn", fresh_db, "--semaphore", "a=b=2", "--json").stdout
        )
        assert doc["semaphores"] == [
            {
                "name": "a=b",
                "limit": 2,
                "held": 1,
                "holders": [{"pid": holder.info.backend_pid, "slot": slot}],
                "waiting": [],
            }
        ]


def test_a_prepared_transaction_blocking_a_waiter_is_shown_as_prepared_not_pid_0() -> None:
    """Regression: ``pg_blocking_pids`` says 0 for a prepared transaction, and the table's
    BLOCKED BY and the wait chains showed it as pid 0 (which ``pgsolo terminate 0``
    refuses). The servers of the tests allow no prepared transaction
    (``max_prepared_transactions = 0``), so the cell is checked as it is made."""
    from pgsolo.cli.locks import pid_text  # noqa: PLC0415

    assert [pid_text(pid) for pid in (4242, 0)] == ["4242", "(prepared)"]
