"""The dashboard's app against the real server: what real sessions hold and wait for
appears, with names, pids and wait chains; a terminate needs the token, the CSRF token
and the dashboard's own origin, and is logged; no password shows; a role that may read
nothing of pgsolo's still gets every page."""

from __future__ import annotations

import contextlib
import logging
import re
import threading
import uuid
from datetime import datetime, timedelta
from pathlib import Path

import psycopg
import pytest
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.testclient import TestClient

import pgsolo
from _support import (
    DEADLINE,
    ROLE_PASSWORD,
    MakeRole,
    eventually,
    in_background,
    role_dsn,
    valid_document,
)
from dashboard.conftest import TOKEN, Holder, unique
from pgsolo.dashboard import create_app
from pgsolo.errors import InvalidArgumentError
from pgsolo.once.operation import lock_key_for as op_lock
from pgsolo.sql import OPERATIONS_LISTED


def row_of(page: str, pid: int) -> str:
    """The ``<tr>`` of the locks table for backend ``pid``."""
    found = re.search(rf'<tr data-pid="{pid}".*?</tr>', page, re.DOTALL)
    assert found, f"no row for pid {pid}"
    return found.group(0)


def backend_alive(observer: psycopg.Connection, pid: int) -> bool:
    row = observer.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,))
    return row.fetchone() == (1,)


def test_the_root_leads_to_the_locks(client: TestClient) -> None:
    response = client.get("/", follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"].endswith("/locks")


def test_a_lock_held_by_a_real_session_appears_with_its_name_and_pid(
    client: TestClient, hold: Holder
) -> None:
    name = unique("dashboard-nightly")
    conn, key = hold(name)
    page = client.get("/locks").text
    row = row_of(page, conn.info.backend_pid)
    assert name in row
    assert key.text in row
    assert f"pgsolo:{name}" in row  # its application_name
    assert "held" in row
    assert "<strong>" not in row  # an idle session, not an idle transaction


def test_a_waiter_and_its_wait_chain_render(client: TestClient, hold: Holder, dsn: str) -> None:
    name = unique("dashboard-chain")
    holder, key = hold(name)
    with psycopg.connect(dsn, autocommit=True, application_name="dashboard-waiter") as waiter:
        in_background(waiter, f"SELECT pg_advisory_lock({key.sql_args})")
        chain = [waiter.info.backend_pid, holder.info.backend_pid]

        def chain_shown() -> bool:
            doc = client.get("/api/locks").json()
            return chain in doc["wait_chains"]

        eventually(chain_shown, "the wait chain in /api/locks")
        page = client.get("/locks").text
        assert f"{chain[0]} → {chain[1]}" in page
        waiting = row_of(page, chain[0])
        assert "waiting" in waiting
        assert str(chain[1]) in waiting  # blocked by
        holder.execute(f"SELECT pg_advisory_unlock({key.sql_args})")


def test_an_idle_in_transaction_holder_is_shown_loud(
    client: TestClient, dsn: str, key: pgsolo.Key
) -> None:
    with psycopg.connect(dsn, application_name="dashboard-stuck") as stuck:
        stuck.execute(f"SELECT pg_advisory_xact_lock({key.sql_args})")  # and stays idle in it
        row = row_of(client.get("/locks").text, stuck.info.backend_pid)
        assert 'class="held loud"' in row
        assert "IDLE IN TRANSACTION" in row
        stuck.rollback()


def test_the_locks_json_is_pgsolo_locks_json(client: TestClient, hold: Holder) -> None:
    conn, key = hold(unique("dashboard-json"))
    doc = valid_document(client.get("/api/locks").json())
    assert doc["schema"] == "pgsolo.locks/1"
    (mine,) = [lock for lock in doc["locks"] if lock["pid"] == conn.info.backend_pid]
    assert (mine["key"], mine["granted"]) == (key.text, True)


def test_the_doctor_page_and_json_are_pgsolo_doctors(client: TestClient) -> None:
    doc = valid_document(client.get("/api/doctor").json())
    names = [check["name"] for check in doc["checks"]]
    assert {"idle-session-locks", "vacuum-horizon", "leaders"} <= set(names)
    page = client.get("/doctor").text
    assert all(f'data-check="{name}"' in page for name in names)


def test_a_semaphore_is_one_row_k_of_n(client: TestClient, dsn: str) -> None:
    name = unique("dashboard-exports")
    with (
        psycopg.connect(dsn, autocommit=True) as first,
        psycopg.connect(dsn, autocommit=True) as second,
        pgsolo.semaphore(first, name, limit=3),
        pgsolo.semaphore(second, name, limit=3),
    ):
        # Told by the holders' application_name, as pgsolo's own connections say it.
        for conn in (first, second):
            conn.execute(f"SET application_name = 'pgsolo:semaphore:{name}/3'")
        page = client.get("/locks").text
        row = re.search(rf'<tr class="semaphore" data-semaphore="{name}">.*?</tr>', page, re.S)
        assert row, "no semaphore row"
        assert "2 of 3 held" in row.group(0)
        uses = client.get("/api/locks").json()["semaphores"]
        assert [(u["held"], u["limit"]) for u in uses if u["name"] == name] == [(2, 3)]


def test_keys_are_named_by_a_registry_given_names_and_semaphores(
    db: str, dsn: str, tmp_path: Path
) -> None:
    """What ``pgsolo locks --registry/--name/--semaphore`` names, the dashboard names:
    sessions that say nothing of pgsolo's (plain SQL) hold a registry's pair, a given
    name's key and two slots of a semaphore given by its name and limit."""
    registered, given, exports = unique("dash-reg"), unique("dash-given"), unique("dash-sem")
    resource = 1_000 + uuid.uuid4().int % 1_000_000
    registry_file = tmp_path / "locks.toml"
    registry_file.write_text(f'[locks]\n"{registered}" = [4711, {resource}]\n')
    registry = pgsolo.Registry.from_toml(registry_file)
    slots = pgsolo.keys.semaphore_keys(exports, 3)
    keys = [registry.resolve(registered), pgsolo.keys.from_name(given), slots[0], slots[2]]
    app = create_app(db, registry=registry, names=[given], semaphores={exports: 3})
    with TestClient(app) as client, contextlib.ExitStack() as stack:
        for key in keys:
            conn = stack.enter_context(psycopg.connect(dsn, autocommit=True))
            conn.execute(f"SELECT pg_advisory_lock({key.sql_args})")
        doc = valid_document(client.get("/api/locks").json())
        names = {lock["key"]: lock["name"] for lock in doc["locks"]}
        assert names[keys[0].text] == registered
        assert names[keys[1].text] == given
        uses = [(u["held"], u["limit"]) for u in doc["semaphores"] if u["name"] == exports]
        assert uses == [(2, 3)]
        page = client.get("/locks").text
        assert registered in page
        assert given in page
        row = re.search(rf'<tr class="semaphore" data-semaphore="{exports}">.*?</tr>', page, re.S)
        assert row, "no semaphore row"
        assert "2 of 3 held" in row.group(0)


def test_a_leader_and_its_waiting_candidate_are_shown(client: TestClient, db: str) -> None:
    """A real leader (``leader()`` on a connection string, its session named by pgsolo)
    and a second candidate waiting in a thread: the leaders list names the leader, its
    pid and the candidate's."""
    name = unique("dashboard-scheduler")
    with pgsolo.leader(db, name, keep=False) as term:
        candidate_pids: list[int] = []

        def stand() -> None:
            with pgsolo.leader(db, name, keep=False, wait=60) as later:
                candidate_pids.append(later.backend_pid)

        thread = threading.Thread(target=stand)
        thread.start()
        try:
            eventually(
                lambda: any(
                    one["name"] == f"pgsolo:leader:{name}" and not one["granted"]
                    for one in client.get("/api/locks").json()["locks"]
                ),
                "the candidate to wait",
            )
            page = client.get("/locks").text
        finally:
            term_pid = term.backend_pid
    thread.join(DEADLINE)
    assert not thread.is_alive()
    leaders = re.search(r'<ul id="leaders">.*?</ul>', page, re.S)
    assert leaders, "no leaders list"
    (item,) = [li for li in re.findall(r"<li>.*?</li>", leaders.group(0), re.S) if name in li]
    assert f"pid {term_pid} leads" in item
    assert f"1 candidate(s) waiting (pid {candidate_pids[0]})" in item


def test_jobs_show_the_ledger_and_the_skip_warning(client: TestClient, db: str) -> None:
    job = unique("dashboard-job")
    pgsolo.run_job(db, job, lambda conn: None, record=True)
    with psycopg.connect(db, autocommit=True) as holder:
        holder.execute(f"SELECT pg_advisory_lock({pgsolo.keys.from_name(job).sql_args})")
        for _ in range(3):  # each an occurrence of its own, as the schedule's next ticks
            holder.execute(
                "UPDATE pgsolo.job_runs SET started_at = started_at - interval '1 hour'"
                " WHERE job = %s",
                (job,),
            )
            pgsolo.run_job(db, job, lambda conn: None, record=True)
    page = client.get(f"/jobs?job={job}").text
    row = re.search(rf'<tr data-job="{job}".*?</tr>', page, re.S)
    assert row, "no row for the job"
    assert "skipped" in row.group(0)
    assert "75%" in row.group(0)
    assert "skips outpace the schedule" in row.group(0)
    doc = valid_document(client.get("/api/jobs", params={"job": job}).json())
    (summary,) = doc["jobs"]
    assert (summary["attempts"], summary["skipped"]) == (4, 3)
    assert summary["warning"] is not None


def test_the_history_filters_by_outcome_and_the_summary_weighs_every_attempt(
    client: TestClient, db: str
) -> None:
    job = unique("dashboard-filtered")
    pgsolo.run_job(db, job, lambda conn: None, record=True)
    with psycopg.connect(db, autocommit=True) as holder:
        holder.execute(f"SELECT pg_advisory_lock({pgsolo.keys.from_name(job).sql_args})")
        pgsolo.run_job(db, job, lambda conn: None, record=True)  # skipped: busy
    doc = valid_document(client.get("/api/jobs", params={"job": job, "outcome": "skipped"}).json())
    assert (doc["job"], doc["outcome"]) == (job, "skipped")
    assert [row["outcome"] for row in doc["attempts"]] == ["skipped"]
    (summary,) = doc["jobs"]
    assert (summary["attempts"], summary["skipped"]) == (2, 1)  # both attempts weighed
    page = client.get("/jobs", params={"job": job, "outcome": "completed"}).text
    history = re.search(r'<table id="history">.*?</table>', page, re.S)
    assert history, "no history table"
    assert "completed" in history.group(0)
    assert "skipped" not in history.group(0)
    assert "<option selected>completed</option>" in page
    refused = client.get("/api/jobs", params={"outcome": "maybe"})
    assert refused.status_code == 400
    error = valid_document(refused.json())["error"]
    assert (error["code"], "outcome is one of" in error["message"]) == ("usage-error", True)
    # A job name the database cannot hold (NUL) is the caller's mistake, said as one: it
    # was an Internal Server Error and a traceback.
    for path in ("/api/jobs", "/jobs"):
        nul = client.get(path, params={"job": "a\0b"})
        assert nul.status_code == 400, nul.text
    nul_error = valid_document(client.get("/api/jobs", params={"job": "\0"}).json())["error"]
    assert nul_error["code"] == "usage-error"


def test_jobs_show_when_each_period_job_is_next_expected(client: TestClient, db: str) -> None:
    """A job done this period is next expected when the next period begins; one whose
    last mark is an earlier period is due now; a job with periods and no ledger row is
    listed too. By the database's clock, in the JSON and on the page."""
    done, late = unique("dashboard-yearly"), unique("dashboard-hourly")
    # A year: the test cannot straddle the turn of its period (but once a year, for a second).
    pgsolo.run_job(db, done, lambda conn: None, period="year", record=True)
    pgsolo.run_job(db, late, lambda conn: None, period="hour")  # no ledger row
    with psycopg.connect(db, autocommit=True) as conn:
        conn.execute(
            "UPDATE pgsolo.job_periods SET period_start = period_start - interval '3 hours'"
            " WHERE job = %s",
            (late,),
        )
        this_year, next_year, this_hour = conn.execute(
            "SELECT date_trunc('year', now(), 'UTC'), date_trunc('year', now(), 'UTC')"
            " + interval '1 year', date_trunc('hour', now(), 'UTC')"
        ).fetchone()
    doc = valid_document(client.get("/api/jobs").json())
    jobs = {summary["job"]: summary for summary in doc["jobs"]}
    (yearly,) = jobs[done]["periods"]
    assert (yearly["period"], yearly["due"]) == ("year", False)
    assert datetime.fromisoformat(yearly["current_period_start"]) == this_year
    assert datetime.fromisoformat(yearly["next_expected"]) == next_year
    (hourly,) = jobs[late]["periods"]
    assert (hourly["period"], hourly["due"]) == ("hour", True)
    # Due: expected in the period under way (whichever hour the read fell in).
    assert hourly["next_expected"] == hourly["current_period_start"]
    due_since = datetime.fromisoformat(hourly["next_expected"])
    assert due_since.timestamp() % 3600 == 0
    assert this_hour <= due_since <= this_hour + timedelta(hours=1)
    assert (jobs[late]["last"], jobs[late]["attempts"], jobs[late]["skip_ratio"]) == (None, 0, None)
    page = client.get("/jobs").text
    row = re.search(rf'<tr data-job="{late}".*?</tr>', page, re.S)
    assert row, "no row for the job without ledger rows"
    assert "due: this period not done yet" in row.group(0)
    assert "no attempt recorded" in row.group(0)
    row = re.search(rf'<tr data-job="{done}".*?</tr>', page, re.S)
    assert row, "no row for the yearly job"
    assert f"next period from {yearly['next_expected']}" in row.group(0)


def test_operations_single_out_a_started_one_whose_holder_is_gone(fresh_db: str) -> None:
    """In a database of its own: the operations other tests leave started come first, and
    enough of them would fill the list before the one that succeeded."""
    done, crashed = unique("dashboard-op"), unique("dashboard-op-crashed")
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        pgsolo.migrate(conn)
    pgsolo.run_once(fresh_db, done, lambda ctx: "ok")
    with psycopg.connect(fresh_db, autocommit=True) as conn:
        # What a worker that died mid-operation leaves: its row started, its lock gone.
        conn.execute(
            "INSERT INTO pgsolo.operations (op_key, state, idempotency_key, attempts)"
            " VALUES (%s, 'started', %s, 1)",
            (crashed, pgsolo.idempotency_key_for(crashed)),
        )
    with TestClient(create_app(fresh_db)) as client:
        page = client.get("/operations").text
        doc = valid_document(client.get("/api/operations").json())
    gone = re.search(rf'<tr data-op="{crashed}".*?</tr>', page, re.S)
    ok = re.search(rf'<tr data-op="{done}".*?</tr>', page, re.S)
    assert gone
    assert ok
    assert "holder gone" in gone.group(0)
    assert "succeeded" in ok.group(0)
    assert "holder gone" not in ok.group(0)
    ops = {op["op_key"]: op for op in doc["operations"]}
    assert ops[crashed]["holder_alive"] is False
    assert ops[done]["holder_alive"] is None


def test_operations_cut_at_the_limit_keep_those_whose_holder_is_gone(fresh_db: str) -> None:
    """Guards the list cut at ``OPERATIONS_LISTED``: its started operations came newest
    first, so with more of them started than that, the one a holder that died left a day
    ago, the one to act on, was cut. The started ones whose holder is gone come first."""
    listed = OPERATIONS_LISTED
    gone = "dashboard-op-gone"
    running = [f"dashboard-op-running-{n}" for n in range(listed + 10)]
    with psycopg.connect(fresh_db, autocommit=True) as holder:
        pgsolo.migrate(holder)
        started = (
            "INSERT INTO pgsolo.operations (op_key, state, idempotency_key, attempts,"
            " updated_at) VALUES (%s, 'started', %s, 1, now() - %s::interval)"
        )
        holder.execute(started, (gone, pgsolo.idempotency_key_for(gone), "1 day"))
        with holder.cursor() as cursor:
            cursor.executemany(
                started, [(op, pgsolo.idempotency_key_for(op), "0 s") for op in running]
            )
        # Their holders are alive: this session holds each one's lock.
        for op in running:
            holder.execute(f"SELECT pg_advisory_lock({op_lock(op).sql_args})")
        with TestClient(create_app(fresh_db)) as client:
            doc = valid_document(client.get("/api/operations").json())
            page = client.get("/operations").text
    ops = doc["operations"]
    assert len(ops) == listed
    assert (ops[0]["op_key"], ops[0]["holder_alive"]) == (gone, False)
    assert all(op["holder_alive"] is True for op in ops[1:])
    row = re.search(rf'<tr data-op="{gone}".*?</tr>', page, re.S)
    assert row
    assert "holder gone" in row.group(0)


def test_metrics_count_the_locks_by_state(fresh_db: str, hold: Holder) -> None:
    holder, key = hold(unique("dashboard-metrics"), fresh_db)
    with (
        TestClient(create_app(fresh_db)) as client,
        psycopg.connect(fresh_db, autocommit=True) as waiter,
    ):
        in_background(waiter, f"SELECT pg_advisory_lock({key.sql_args})")

        def counts() -> dict[str, str]:
            text = client.get("/metrics").text
            return dict(re.findall(r'^pgsolo_advisory_locks\{state="(\w+)"\} (\d+)$', text, re.M))

        eventually(lambda: counts() == {"granted": "1", "waiting": "1"}, "one held, one waiting")
        text = client.get("/metrics").text
        assert 'pgsolo_advisory_locks_by_age{state="granted",le="+Inf"} 1' in text
        assert 'pgsolo_advisory_locks_by_age{state="waiting",le="86400"} 1' in text
        assert client.get("/metrics").headers["content-type"].startswith("text/plain")
        holder.execute(f"SELECT pg_advisory_unlock({key.sql_args})")


def test_without_allow_terminate_there_is_no_terminate_route(
    client: TestClient, hold: Holder, observer: object
) -> None:
    conn, _ = hold(unique("dashboard-readonly"))
    pid = conn.info.backend_pid
    assert client.get(f"/terminate/{pid}").status_code == 404
    assert client.post(f"/terminate/{pid}", data={"token": TOKEN}).status_code == 404
    assert 'href="/terminate/' not in client.get("/locks").text
    conn.execute("SELECT 1")  # still alive


def test_a_post_without_the_token_or_the_csrf_token_terminates_nothing(
    guarded: TestClient, hold: Holder, connect: object, caplog: pytest.LogCaptureFixture
) -> None:
    conn, _ = hold(unique("dashboard-victim"))
    pid = conn.info.backend_pid
    confirm = guarded.get(f"/terminate/{pid}").text
    csrf = re.search(r'name="csrf" value="(\w+)"', confirm)
    assert csrf, "no CSRF token in the confirmation form"
    other = guarded.get(f"/terminate/{pid + 1}").text
    other_csrf = re.search(r'name="csrf" value="(\w+)"', other)
    attempts = [
        {},
        {"token": TOKEN},  # no CSRF token
        {"csrf": csrf.group(1)},  # no token
        {"csrf": csrf.group(1), "token": "wrong"},
        {"csrf": "0" * 64, "token": TOKEN},
    ]
    if other_csrf:  # another backend's form cannot end this one
        attempts.append({"csrf": other_csrf.group(1), "token": TOKEN})
    with caplog.at_level(logging.WARNING, logger="pgsolo.dashboard"):
        for form in attempts:
            response = guarded.post(f"/terminate/{pid}", data=form)
            assert response.status_code == 403, form
            assert "was not terminated" in response.text
        cross = guarded.post(
            f"/terminate/{pid}",
            data={"csrf": csrf.group(1), "token": TOKEN},
            headers={"origin": "https://evil.example"},
        )
        assert cross.status_code == 403
        assert "another origin" in cross.text
    conn.execute("SELECT 1")  # the backend is alive, its lock held
    assert (
        sum("refused to terminate" in r.getMessage() for r in caplog.records) == len(attempts) + 1
    )


def test_the_token_and_the_csrf_token_terminate_and_it_is_logged(
    guarded: TestClient, hold: Holder, observer: object, caplog: pytest.LogCaptureFixture
) -> None:
    name = unique("dashboard-leaked")
    conn, key = hold(name)
    pid = conn.info.backend_pid
    confirm = guarded.get(f"/terminate/{pid}")
    assert name in confirm.text  # what it holds, before anything is done
    assert 'http-equiv="refresh"' not in confirm.text  # nothing changes under a decision
    csrf = re.search(r'name="csrf" value="(\w+)"', confirm.text)
    assert csrf
    base = str(guarded.base_url)
    with caplog.at_level(logging.WARNING, logger="pgsolo.dashboard"):
        done = guarded.post(
            f"/terminate/{pid}",
            data={"csrf": csrf.group(1), "token": TOKEN},
            headers={"origin": base.rstrip("/")},
        )
    assert done.status_code == 200, done.text
    assert f"Backend {pid} terminated" in done.text
    assert key.text in done.text
    (line,) = [r.getMessage() for r in caplog.records if "terminated backend" in r.getMessage()]
    assert str(pid) in line
    assert name in line
    with pytest.raises(psycopg.OperationalError):
        conn.execute("SELECT 1")


def test_the_token_may_come_in_a_header(guarded: TestClient, hold: Holder) -> None:
    conn, _ = hold(unique("dashboard-scripted"))
    pid = conn.info.backend_pid
    csrf = re.search(r'name="csrf" value="(\w+)"', guarded.get(f"/terminate/{pid}").text)
    assert csrf
    done = guarded.post(
        f"/terminate/{pid}", data={"csrf": csrf.group(1)}, headers={"x-pgsolo-token": TOKEN}
    )
    assert done.status_code == 200
    with pytest.raises(psycopg.OperationalError):
        conn.execute("SELECT 1")


def test_a_backend_holding_no_advisory_lock_is_not_terminated(
    guarded: TestClient, hold: Holder, caplog: pytest.LogCaptureFixture
) -> None:
    conn, key = hold(unique("dashboard-let-go"))
    pid = conn.info.backend_pid
    csrf = re.search(r'name="csrf" value="(\w+)"', guarded.get(f"/terminate/{pid}").text)
    assert csrf
    conn.execute(f"SELECT pg_advisory_unlock({key.sql_args})")  # while someone decided
    page = guarded.get(f"/terminate/{pid}").text
    assert "nothing to terminate" in page
    assert 'id="confirm"' not in page
    # The form served while it held the lock, both tokens right: still not ended, as
    # pgsolo terminate refuses a PID that holds nothing without --force.
    with caplog.at_level(logging.WARNING, logger="pgsolo.dashboard"):
        late = guarded.post(f"/terminate/{pid}", data={"csrf": csrf.group(1), "token": TOKEN})
    assert late.status_code == 409
    conn.execute("SELECT 1")
    # Every refusal is logged, this one too (it was not).
    assert any(f"refused to terminate backend {pid}" in r.getMessage() for r in caplog.records)


def test_no_password_appears_on_any_page(make_role: MakeRole, fresh_db: str) -> None:
    role, _ = make_role()
    with_password = role_dsn(fresh_db, role)
    assert ROLE_PASSWORD in with_password
    pages = ["/locks", "/jobs", "/operations", "/doctor", "/metrics"]
    pages += ["/api/locks", "/api/jobs", "/api/operations", "/api/doctor"]
    with TestClient(create_app(with_password)) as client:
        for page in pages:
            response = client.get(page)
            assert response.status_code == 200, (page, response.text)
            assert ROLE_PASSWORD not in response.text
    unreachable = "postgresql://someone:s3cret-pw-77@127.0.0.1:1/nowhere?connect_timeout=2"
    with TestClient(create_app(unreachable)) as client:
        for page in ("/locks", "/api/locks", "/metrics"):
            response = client.get(page)
            assert response.status_code == 503
            assert "s3cret-pw-77" not in response.text
            # No connection string either, not even redacted (DESIGN, Dashboard): the
            # error pages showed postgresql://someone:***@127.0.0.1:1/nowhere.
            assert "postgresql://" not in response.text
            assert "someone" not in response.text
        assert "did not answer" in client.get("/doctor").text
        assert client.get("/api/doctor").json()["error"]["code"] == "database-unavailable"
    with TestClient(create_app(with_password)) as client:
        # The request's own mistake is said as one, not as a database that did not answer.
        refused = client.get("/jobs", params={"outcome": "maybe"})
        assert refused.status_code == 400
        assert "The request is not one the dashboard takes" in refused.text
        assert "did not answer" not in refused.text
        assert "tries again" not in refused.text


def test_a_role_that_may_read_nothing_of_pgsolos_gets_every_page(
    make_role: MakeRole, fresh_db: str, admin: psycopg.Connection, hold: Holder
) -> None:
    pgsolo.migrate(admin)  # pgsolo's tables, on which the role has no privilege
    role, _ = make_role()
    _, key = hold(unique("dashboard-ro"), fresh_db)
    with TestClient(create_app(role_dsn(fresh_db, role))) as client:
        locks = client.get("/api/locks").json()
        assert [lock["key"] for lock in locks["locks"]] == [key.text]
        assert client.get("/doctor").status_code == 200
        jobs = client.get("/jobs")
        assert jobs.status_code == 200
        assert "GRANT SELECT ON TABLE pgsolo.job_runs" in jobs.text
        operations = valid_document(client.get("/api/operations").json())
        assert "pgsolo.operations" in operations["notice"]


def test_a_role_that_may_read_the_ledger_only_gets_a_notice_for_the_periods(
    make_role: MakeRole, fresh_db: str, admin: psycopg.Connection
) -> None:
    """The periods are read apart from the ledger: a role granted what ``pgsolo history``
    needs still sees its jobs, with the GRANT that would show their periods."""
    pgsolo.migrate(admin)
    job = unique("dashboard-ledger-only")
    pgsolo.run_job(fresh_db, job, lambda conn: None, period="day", record=True)
    role, _ = make_role()
    for grant in pgsolo.sql.grants(role, ("history",)):
        admin.execute(grant)
    with TestClient(create_app(role_dsn(fresh_db, role))) as client:
        doc = valid_document(client.get("/api/jobs").json())
    assert doc["notice"] is None
    assert "pgsolo.job_periods" in doc["periods_notice"]
    (summary,) = doc["jobs"]
    assert (summary["job"], summary["attempts"], summary["periods"]) == (job, 1, [])


def test_a_database_without_pgsolos_tables_gets_a_notice(fresh_db: str) -> None:
    with TestClient(create_app(fresh_db)) as client:
        jobs = client.get("/jobs")
        assert jobs.status_code == 200
        assert "pgsolo migrate" in jobs.text
        assert "pgsolo migrate" in valid_document(client.get("/api/operations").json())["notice"]


def test_pages_work_without_scripts_and_refresh_themselves(client: TestClient) -> None:
    page = client.get("/locks")
    assert '<meta name="viewport"' in page.text
    assert '<noscript><meta http-equiv="refresh" content="5"></noscript>' in page.text
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    assert client.get("/static/dashboard.js").status_code == 200


def test_it_mounts_under_a_prefix(db: str) -> None:
    outer = Starlette(routes=[Mount("/ops/pgsolo", create_app(db))])
    with TestClient(outer) as client:
        page = client.get("/ops/pgsolo/locks")
        assert page.status_code == 200
        assert 'href="http://testserver/ops/pgsolo/jobs"' in page.text
        assert client.get("/ops/pgsolo/api/locks").json()["schema"] == "pgsolo.locks/1"


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"allow_terminate": True}, "needs a token"),
        ({"refresh_seconds": 0}, "refresh_seconds"),
        ({"refresh_seconds": float("nan")}, "refresh_seconds"),
        ({"names": "one-name"}, "a list of names"),
        ({"semaphores": {"exports": 0}}, "semaphores="),
        ({"registry": "locks.toml"}, "pgsolo.Registry"),
    ],
)
def test_bad_arguments_are_refused_before_anything_connects(
    options: dict[str, object], message: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        create_app("postgresql://nobody@127.0.0.1:1/nowhere", **options)  # type: ignore[arg-type]


def test_the_app_opens_no_session_between_requests(
    client: TestClient, observer: object, dsn: str
) -> None:
    client.get("/locks")
    with psycopg.connect(dsn, autocommit=True) as look:
        left = look.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pgsolo:dashboard'"
        ).fetchone()
    assert left == (0,)
