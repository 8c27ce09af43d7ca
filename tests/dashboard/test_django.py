"""The dashboard as a Django project's URL include (``pgsolo.django.dashboard``), served
for real: the test project (``tests/django_project``, ``PGSOLO_TEST_SITE=1``) under
``manage.py runserver``, on a database of this module's own, with a staff user who logs in
through the admin's own login form and a user who is not staff. Only staff see anything;
what a real session holds appears as on the ASGI app; Django's connection is given back
as it was found, also when each request is a transaction (``ATOMIC_REQUESTS``).

One server per setting for the whole module (``site``; ``atomic_site`` for the tests of
``ATOMIC_REQUESTS``), each a single thread whose one connection is kept between requests
and named, so that the tests can look at it after a request.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email.message import Message
from http.cookiejar import CookieJar
from importlib import resources
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest
from psycopg import sql as pgsql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

import pgsolo
from _drivers import django_settings
from _support import DEADLINE, eventually, manage, manage_py, valid_document
from dashboard.conftest import Holder, unique

STAFF, PLAIN = "staff", "plain"
PASSWORD = "pgsolo-test-site-secret"  # noqa: S105 - the test site's users' own

PAGES = ["locks", "jobs", "operations", "doctor"]
EVERY_PATH = ["", *PAGES, *(f"api/{page}" for page in PAGES), "metrics"]
EVERY_PATH += ["static/dashboard.css", "static/dashboard.js"]


@dataclass
class Response:
    status: int
    headers: Message
    text: str


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is the answer the tests look at, not a request to make."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


class Browser:
    """A visitor of the site at ``base``, with cookies of its own, who follows no
    redirect."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.opener = urllib.request.build_opener(
            urllib.request.HTTPCookieProcessor(CookieJar()), _NoRedirect()
        )

    def get(self, path: str) -> Response:
        return self._open(path, None)

    def post(self, path: str, fields: dict[str, str]) -> Response:
        return self._open(path, urllib.parse.urlencode(fields).encode())

    def _open(self, path: str, body: bytes | None) -> Response:
        request = urllib.request.Request(self.base + path, data=body)  # noqa: S310 - http://127.0.0.1
        try:
            with self.opener.open(request, timeout=DEADLINE) as answer:
                return Response(answer.status, answer.headers, answer.read().decode())
        except urllib.error.HTTPError as refused:  # 3xx, 4xx and 5xx: answers too
            with refused:
                return Response(refused.code, refused.headers, refused.read().decode())

    def log_in(self, form: str, user: str) -> Response:
        """Log ``user`` in through the login form at ``form``, as a person would: the
        form's CSRF cookie and token, then its POST."""
        page = self.get(form)
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.text)
        assert token, page.text
        fields = {"csrfmiddlewaretoken": token.group(1), "username": user, "password": PASSWORD}
        return self.post(form, {**fields, "next": "/pgsolo/locks"})


def staff(base: str) -> Browser:
    """A staff user, logged in through the admin's login page."""
    browser = Browser(base)
    done = browser.log_in("/admin/login/", STAFF)
    assert (done.status, done.headers["location"]) == (302, "/pgsolo/locks"), done.text
    return browser


@pytest.fixture(scope="module")
def site_db(dsn: str) -> Iterator[str]:
    """A database of this module's own, migrated by the project (the admin's tables and
    pgsolo's), with the users :data:`STAFF` (a superuser) and :data:`PLAIN` (no staff)."""
    name = f"pgsolo_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        try:
            admin.execute(pgsql.SQL("CREATE DATABASE {}").format(pgsql.Identifier(name)))
        except psycopg.errors.InsufficientPrivilege:
            pytest.skip("the test role cannot create databases")
    site = make_conninfo(dsn, dbname=name)
    try:
        for args, env in [
            (["migrate"], {}),
            (
                ["createsuperuser", "--noinput", "--username", STAFF, "--email", "s@example.com"],
                {"DJANGO_SUPERUSER_PASSWORD": PASSWORD},
            ),
            (
                [
                    "shell",
                    "-c",
                    "from django.contrib.auth.models import User;"
                    f" User.objects.create_user({PLAIN!r}, password={PASSWORD!r})",
                ],
                {},
            ),
        ]:
            done = manage(site, *args, PGSOLO_TEST_SITE="1", **env)
            assert done.returncode == 0, done.stderr
        yield site
    finally:
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute(
                pgsql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(pgsql.Identifier(name))
            )


@contextmanager
def served(site_db: str, log: Path, **env: str) -> Iterator[str]:
    """``manage.py runserver`` of the test site on a free port, on one thread (so one
    connection of Django's, kept between requests), until the block ends; its address."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    base = f"http://127.0.0.1:{port}"
    with log.open("w") as output:
        server = subprocess.Popen(
            **manage_py(
                site_db,
                "runserver",
                "--noreload",
                "--nothreading",
                f"127.0.0.1:{port}",
                PGSOLO_TEST_SITE="1",
                **env,
            ),
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:

        def answers() -> bool:
            assert server.poll() is None, log.read_text()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    return True
            except OSError:
                return False

        eventually(answers, "runserver to listen", timeout=60)
        yield base
    finally:
        server.terminate()
        server.wait(timeout=DEADLINE)


@pytest.fixture(scope="module")
def site(site_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with served(site_db, tmp_path_factory.mktemp("site") / "runserver.log") as base:
        yield base


@pytest.fixture(scope="module")
def atomic_site(site_db: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The same site with ``ATOMIC_REQUESTS``: each view runs in a transaction."""
    log = tmp_path_factory.mktemp("atomic") / "runserver.log"
    with served(site_db, log, PGSOLO_TEST_ATOMIC_REQUESTS="1") as base:
        yield base


def row_of(page: str, pid: int) -> str:
    found = re.search(rf'<tr data-pid="{pid}".*?</tr>', page, re.DOTALL)
    assert found, f"no row for pid {pid}"
    return found.group(0)


def test_the_include_needs_django_and_jinja2_not_starlette() -> None:
    """Guards ``pgsolo.dashboard``'s lazy ``create_app``: a Django project installs no ASGI
    framework for the include."""
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys, django; from django.conf import settings; settings.configure();"
            " django.setup(); import pgsolo.django.dashboard;"
            " print(sorted({m.split('.')[0] for m in sys.modules} & {'starlette', 'uvicorn'}))",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout.strip()) == (0, "[]"), done.stderr


# -- who may look ----------------------------------------------------------------------------


@pytest.mark.parametrize("visitor", ["anonymous", "not staff"])
def test_anyone_but_staff_is_sent_to_the_admins_login_and_sees_nothing(
    visitor: str, site: str, site_db: str, hold: Holder
) -> None:
    """``staff_member_required`` on every view, the static files included: a visitor who
    is not logged in, and a user logged in through the project's own login page who is
    not staff, get the admin's login and nothing of the locks."""
    name = unique("django-hidden")
    conn, _ = hold(name, site_db)
    browser = Browser(site)
    if visitor == "not staff":
        assert browser.log_in("/accounts/login/", PLAIN).status == 302  # logged in
    for path in EVERY_PATH:
        response = browser.get(f"/pgsolo/{path}")
        login = f"/admin/login/?next={urllib.parse.quote(f'/pgsolo/{path}')}"
        assert (response.status, response.headers["location"]) == (302, login), path
        assert name not in response.text
        assert str(conn.info.backend_pid) not in response.text


# -- what staff see --------------------------------------------------------------------------


def test_staff_see_a_lock_held_by_a_real_session_with_its_name_and_pid(
    site: str, site_db: str, hold: Holder
) -> None:
    name = unique("django-nightly")
    conn, key = hold(name, site_db)
    browser = staff(site)
    page = browser.get("/pgsolo/locks")
    assert page.status == 200
    row = row_of(page.text, conn.info.backend_pid)
    assert name in row
    assert key.text in row
    assert "read-only" in page.text
    assert 'href="/pgsolo/jobs"' in page.text  # url_for through Django's reverse
    assert 'href="/pgsolo/static/dashboard.css"' in page.text
    api = browser.get("/pgsolo/api/locks")
    assert api.headers["content-type"] == "application/json"
    doc = valid_document(json.loads(api.text))
    (mine,) = [lock for lock in doc["locks"] if lock["pid"] == conn.info.backend_pid]
    assert (mine["key"], mine["name"], mine["granted"]) == (key.text, name, True)


def test_the_settings_name_keys_as_pgsolo_locks_name_does(site: str, site_db: str) -> None:
    """``PGSOLO_DASHBOARD_NAMES`` (the test project's: ``settings-named-key``) names a key
    that a session saying nothing of pgsolo's holds."""
    key = pgsolo.keys.from_name("settings-named-key")
    with psycopg.connect(site_db, autocommit=True, application_name="plain-sql") as conn:
        conn.execute(f"SELECT pg_advisory_lock({key.sql_args})")
        doc = valid_document(json.loads(staff(site).get("/pgsolo/api/locks").text))
        (mine,) = [lock for lock in doc["locks"] if lock["pid"] == conn.info.backend_pid]
    assert (mine["key"], mine["name"]) == (key.text, "settings-named-key")


def test_staff_get_the_jobs_operations_and_doctor_pages_and_their_json(
    site: str, site_db: str
) -> None:
    job, op = unique("django-job"), unique("django-op")
    pgsolo.run_job(site_db, job, lambda conn: None, record=True)
    with psycopg.connect(site_db, autocommit=True) as conn:
        assert pgsolo.run_once(conn, op, lambda ctx: 1).outcome == "ran"
    browser = staff(site)
    jobs = browser.get(f"/pgsolo/jobs?job={job}")
    assert jobs.status == 200
    assert f'data-job="{job}"' in jobs.text
    doc = valid_document(json.loads(browser.get(f"/pgsolo/api/jobs?job={job}").text))
    assert [summary["job"] for summary in doc["jobs"]] == [job]
    operations = browser.get("/pgsolo/operations")
    assert (operations.status, op in operations.text) == (200, True)
    doc = valid_document(json.loads(browser.get("/pgsolo/api/operations").text))
    assert op in [operation["op_key"] for operation in doc["operations"]]
    doc = valid_document(json.loads(browser.get("/pgsolo/api/doctor").text))
    doctor = browser.get("/pgsolo/doctor").text
    assert all(f'data-check="{check["name"]}"' in doctor for check in doc["checks"])
    metrics = browser.get("/pgsolo/metrics")
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert 'pgsolo_advisory_locks{state="granted"}' in metrics.text


def test_the_root_leads_to_the_locks(site: str) -> None:
    response = staff(site).get("/pgsolo/")
    assert (response.status, response.headers["location"]) == (303, "/pgsolo/locks")


def test_the_static_files_come_from_the_package_with_their_content_types(site: str) -> None:
    """No ``collectstatic``: the include serves the package's own two files."""
    browser = staff(site)
    static = resources.files("pgsolo.dashboard").joinpath("static")
    for name, content_type in [("dashboard.css", "text/css"), ("dashboard.js", "text/javascript")]:
        response = browser.get(f"/pgsolo/static/{name}")
        assert response.status == 200
        assert response.headers["content-type"].split(";")[0] == content_type
        assert response.text == static.joinpath(name).read_text()
    assert browser.get("/pgsolo/static/nothing.txt").status == 404


def test_every_response_has_the_dashboards_headers(site: str) -> None:
    browser = staff(site)
    for path in EVERY_PATH:
        headers = browser.get(f"/pgsolo/{path}").headers
        assert "frame-ancestors 'none'" in headers["content-security-policy"], path
        assert (headers["x-frame-options"], headers["cache-control"]) == ("DENY", "no-store")


def test_no_password_of_the_database_appears_on_any_page(site: str, site_db: str) -> None:
    secret = conninfo_to_dict(site_db).get("password")
    if not secret:
        pytest.skip("the test server's connection string has no password")
    browser = staff(site)
    for path in EVERY_PATH:
        response = browser.get(f"/pgsolo/{path}")
        assert response.status in (200, 303), (path, response.text)
        assert str(secret) not in response.text


# -- Django's connection, as it was found ---------------------------------------------------


@pytest.mark.parametrize("served_by", ["site", "atomic_site"])
def test_the_projects_connection_is_left_idle_and_holding_nothing(
    served_by: str, site_db: str, hold: Holder, request: pytest.FixtureRequest
) -> None:
    """Every page read through Django's own connection, kept between requests: afterwards
    it is in no transaction and holds no advisory lock, also when the request was one
    transaction (``ATOMIC_REQUESTS``), whose reads neither committed nor broke it."""
    base: str = request.getfixturevalue(served_by)
    conn, _ = hold(unique("django-as-found"), site_db)
    browser = staff(base)
    for path in EVERY_PATH:
        response = browser.get(f"/pgsolo/{path}")
        assert response.status in (200, 303), (path, response.text)
    assert str(conn.info.backend_pid) in browser.get("/pgsolo/locks").text
    name = "pgsolo-test-site-atomic" if served_by == "atomic_site" else "pgsolo-test-site"
    with psycopg.connect(site_db, autocommit=True) as look:

        def settled() -> list[tuple[int, str]]:
            rows = look.execute(
                "SELECT pid, state FROM pg_stat_activity WHERE datname = current_database()"
                " AND application_name = %s",
                (name,),
            ).fetchall()
            return rows if rows and all(state == "idle" for _, state in rows) else []

        backends = eventually(settled, f"{name}'s connection to be idle")
        held = look.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = ANY(%s)",
            ([pid for pid, _ in backends],),
        ).fetchone()
    assert held == (0,)


def test_a_read_that_fails_in_the_requests_transaction_leaves_it_usable(db: str, dsn: str) -> None:
    """Guards the savepoint around the reads in an atomic block (``ATOMIC_REQUESTS``, or
    the project's own ``atomic`` around the view): with the ledger unreadable to the
    transaction's role, the jobs' JSON carries the notice, and the transaction goes on as
    it was (its role and settings kept, its next statement answered) rather than aborted.
    In this process, on the view itself: a failed read leaves nothing a request of
    ``runserver`` would show."""
    django_settings(db)
    from django.db import connection, transaction  # noqa: PLC0415 - once it is configured
    from django.test import RequestFactory  # noqa: PLC0415

    from pgsolo.django import dashboard  # noqa: PLC0415

    (api_jobs,) = [url.callback for url in dashboard.urlpatterns if url.name == "api_jobs"]
    request = RequestFactory().get("/pgsolo/api/jobs")
    request.user = SimpleNamespace(is_active=True, is_staff=True)  # what the check reads
    role = f"pgsolo_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(pgsql.SQL("CREATE ROLE {} NOLOGIN").format(pgsql.Identifier(role)))
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute("SELECT set_config('pgsolo_test.mark', 'kept', true)")
                    cursor.execute(pgsql.SQL("SET LOCAL ROLE {}").format(pgsql.Identifier(role)))
                response = api_jobs(request)
                with connection.cursor() as cursor:
                    cursor.execute("SELECT current_user, current_setting('pgsolo_test.mark')")
                    assert cursor.fetchone() == (role, "kept")
                transaction.set_rollback(True)
        finally:
            connection.close()
            admin.execute(pgsql.SQL("DROP ROLE {}").format(pgsql.Identifier(role)))
    assert response.status_code == 200
    doc = valid_document(json.loads(response.content))
    assert "GRANT" in doc["notice"]


def test_no_setting_of_the_reads_stays_on_the_connection_outside_a_transaction(
    db: str,
) -> None:
    """Guards the transaction the reads run in, rolled back, outside an atomic block:
    the doctor's proxy check stamps its session with a setting of pgsolo's, which
    would otherwise stay on the project's connection after the request."""
    django_settings(db)
    from django.db import connection  # noqa: PLC0415 - once it is configured
    from django.test import RequestFactory  # noqa: PLC0415

    from pgsolo.django import dashboard  # noqa: PLC0415

    views = {url.name: url.callback for url in dashboard.urlpatterns}
    request = RequestFactory().get("/pgsolo/api/doctor")
    request.user = SimpleNamespace(is_active=True, is_staff=True)  # what the check reads
    try:
        for name in ("api_doctor", "api_locks", "api_jobs", "api_operations"):
            assert views[name](request).status_code == 200, name
        assert not connection.in_atomic_block
        with connection.cursor() as cursor:
            cursor.execute("SELECT current_setting('pgsolo.session_token', true)")
            assert cursor.fetchone() in ((None,), ("",))
        assert connection.get_autocommit()
    finally:
        connection.close()
