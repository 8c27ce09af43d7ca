"""End to end: ``pgsolo dashboard`` served by uvicorn in a process of its own, read by a
real headless Chromium (Debian's ``chromium``): the DOM after the page's script ran, and
a screenshot of each page at a laptop's and a phone's size.

``PGSOLO_WRITE_SCREENSHOTS=1`` writes the laptop-size screenshots into docs/dashboard/
(the ones docs/dashboard.md shows); otherwise they go to the test's own directory.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import pgsolo
from _support import eventually, in_background
from dashboard.conftest import Holder

ROOT = Path(__file__).resolve().parents[2]
PAGES = ("locks", "jobs", "operations", "doctor")
LAPTOP, PHONE = "1280,900", "390,844"
CHROMIUM = shutil.which("chromium")

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="no `chromium` on PATH (Debian: apt-get install chromium)"
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:  # noqa: S310 - our own server
        text: str = response.read().decode("utf-8")
        return text


def answers(url: str) -> bool:
    try:
        get(url)
    except OSError:
        return False
    return True


def chromium(*args: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--virtual-time-budget=4000", *args],
        capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip


@pytest.fixture
def seeded(fresh_db: str, hold: Holder, admin: psycopg.Connection) -> Iterator[str]:
    """A database with something on every page: jobs in the ledger (one that mostly
    skips, one done for the day), operations (one left by a dead holder), a named lock, a
    waiter behind it, an idle transaction holding one, and a semaphore's slots."""
    pgsolo.migrate(admin)
    pgsolo.run_job(fresh_db, "nightly-report", lambda conn: None, record=True, period="day")
    with psycopg.connect(fresh_db, autocommit=True) as blocker:
        blocker.execute(f"SELECT pg_advisory_lock({pgsolo.keys.from_name('hourly-sync').sql_args})")
        for _ in range(4):
            admin.execute("UPDATE pgsolo.job_runs SET started_at = started_at - interval '1h'")
            pgsolo.run_job(fresh_db, "hourly-sync", lambda conn: None, record=True)
    pgsolo.run_once(fresh_db, "invoice-2024-0042", lambda ctx: {"sent": True})
    admin.execute(
        "INSERT INTO pgsolo.operations (op_key, state, idempotency_key, attempts, host, pid)"
        " VALUES ('refund-7731', 'started', %s, 2, 'worker-3', 4242)",
        (pgsolo.idempotency_key_for("refund-7731"),),
    )
    holder, key = hold("daily-settlement", fresh_db)
    with (
        psycopg.connect(fresh_db, autocommit=True, application_name="billing-worker") as waiter,
        psycopg.connect(fresh_db, application_name="reports-api") as stuck,
        psycopg.connect(fresh_db, autocommit=True) as slot1,
        psycopg.connect(fresh_db, autocommit=True) as slot2,
        pgsolo.semaphore(slot1, "exports", limit=3),
        pgsolo.semaphore(slot2, "exports", limit=3),
    ):
        for slot in (slot1, slot2):
            slot.execute("SET application_name = 'pgsolo:semaphore:exports/3'")
        stuck.execute(
            f"SELECT pg_advisory_xact_lock({pgsolo.keys.from_name('cache-warm').sql_args})"
        )
        in_background(waiter, f"SELECT pg_advisory_lock({key.sql_args})")
        yield fresh_db
        stuck.rollback()
        holder.execute(f"SELECT pg_advisory_unlock({key.sql_args})")


@pytest.fixture
def served(seeded: str) -> Iterator[tuple[str, psycopg.Connection]]:
    """``pgsolo dashboard`` on a free port, refreshing every second, naming the key the
    idle transaction holds by plain SQL (``--name``): its base URL."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    server = subprocess.Popen(
        [sys.executable, "-m", "pgsolo", "dashboard", "--dsn", seeded, "--port", str(port),
         "--refresh", "1", "--name", "cache-warm"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        eventually(lambda: server.poll() is not None or answers(f"{base}/locks"), "the server")
        assert server.poll() is None, server.communicate()
        with psycopg.connect(seeded, autocommit=True) as look:
            yield base, look
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_the_rendered_locks_page_after_its_script_ran(
    served: tuple[str, psycopg.Connection],
) -> None:
    base, look = served
    eventually(
        lambda: (
            look.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            ).fetchone()
            == (1,)
        ),
        "the waiter",
    )
    done = chromium("--dump-dom", f"{base}/locks")
    assert done.returncode == 0, done.stderr
    dom = done.stdout
    assert 'data-js="on"' in dom  # the script ran
    assert 'data-refreshes="' in dom  # and refreshed the table in place
    assert "daily-settlement" in dom
    assert "IDLE IN TRANSACTION" in dom
    assert "cache-warm" in dom  # named by --name, its holder saying nothing of it
    assert "2 of 3 held" in dom
    assert " → " in dom  # the wait chain


@pytest.mark.parametrize("page", PAGES)
def test_each_page_in_a_laptop_and_a_phone_screenshot(
    served: tuple[str, psycopg.Connection], page: str, tmp_path: Path
) -> None:
    base, _ = served
    write = os.environ.get("PGSOLO_WRITE_SCREENSHOTS") == "1"
    laptop = (ROOT / "docs" / "dashboard" if write else tmp_path) / f"{page}.png"
    phone = tmp_path / f"{page}-phone.png"
    for path, size in ((laptop, LAPTOP), (phone, PHONE)):
        done = chromium(f"--screenshot={path}", f"--window-size={size}", f"{base}/{page}")
        assert done.returncode == 0, done.stderr
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size < 400_000
    dom = chromium("--dump-dom", f"{base}/{page}").stdout
    assert 'data-js="on"' in dom
    assert "did not answer" not in dom
    if page == "jobs":
        assert 'data-period="day"' in dom  # nightly-report's next expected day


def test_a_site_that_rebinds_its_name_to_this_machine_cannot_read_the_dashboard(
    served: tuple[str, psycopg.Connection],
) -> None:
    """Guards DNS rebinding: a page of another site whose name resolves to 127.0.0.1 is
    same-origin with the dashboard in the browser, and read every page (every session's
    pid, application name and query) and the terminate form's CSRF token. The dashboard
    now answers only the Host names it is reached by on its address."""
    base, _ = served
    port = base.rsplit(":", 1)[1]
    attacker = f"http://rebind.attacker.test:{port}/api/locks"
    page = chromium(
        "--host-resolver-rules=MAP rebind.attacker.test 127.0.0.1", "--dump-dom", attacker
    )
    assert "Invalid host header" in page.stdout, page.stdout[:300]
    assert "pgsolo.locks/1" not in page.stdout
    for own in (f"{base}/api/locks", f"http://localhost:{port}/api/locks"):
        assert "pgsolo.locks/1" in get(own)
