"""``pgsolo run --metrics-textfile`` and ``--pushgateway``: a run's metrics, published when
it ends, read back from the file node_exporter would read and from a real HTTP server
standing in for the Pushgateway (it records what it is sent)."""

from __future__ import annotations

import http.server
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from _support import Connect, hold, new_job, pgsolo_cli, run_args, unhold

PY = sys.executable
GAUGE = "pgsolo_job_last_success_timestamp_seconds"


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(text: str, name: str, **labels: str) -> float | None:
    return samples(text).get((name, frozenset(labels.items())))


def test_the_textfile_counts_the_run_and_keeps_the_last_success_across_a_skip(
    migrated: str, connect: Connect, tmp_path: Path
) -> None:
    job = new_job("cli-metrics")
    path = tmp_path / "job.prom"
    args = [*run_args(job, migrated), "--metrics-textfile", str(path), "--"]
    before = time.time()
    assert pgsolo_cli(*args, PY, "-c", "pass").returncode == 0
    first = path.read_text()
    success = sample(first, GAUGE, job=job)
    assert success is not None
    assert before <= success <= time.time()
    assert sample(first, "pgsolo_job_attempts_total", job=job, outcome="completed", reason="") == 1
    acquired = {"lock": job, "lifetime": "session", "outcome": "acquired"}
    assert sample(first, "pgsolo_lock_acquisitions_total", **acquired) == 1
    assert "process_cpu_seconds_total" not in first  # node_exporter has its own

    holder = hold(connect, job)
    assert pgsolo_cli(*args, PY, "-c", "pass").returncode == 75
    unhold(holder, job)
    second = path.read_text()
    assert (
        sample(second, "pgsolo_job_attempts_total", job=job, outcome="skipped", reason="busy") == 1
    )
    assert (
        sample(second, "pgsolo_job_attempts_total", job=job, outcome="completed", reason="") is None
    )
    assert sample(second, GAUGE, job=job) == success  # the skip did not erase it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.prom"]


def test_a_textfile_not_ending_in_prom_is_a_usage_error_before_the_command(
    migrated: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    done = pgsolo_cli(
        *run_args(new_job("cli-metrics"), migrated),
        "--metrics-textfile",
        str(tmp_path / "job.txt"),
        "--",
        PY,
        "-c",
        f"open({str(marker)!r}, 'w')",
    )
    assert done.returncode == 2
    assert ".prom" in done.stderr
    assert not marker.exists()


class Recorder(http.server.BaseHTTPRequestHandler):
    pushes: list[tuple[str, str, str]]  # method, path, body

    def _record(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.pushes.append((self.command, self.path, body.decode()))
        self.send_response(200)
        self.end_headers()

    do_POST = do_PUT = _record

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[tuple[str, list[tuple[str, str, str]]]]:
    """A real HTTP server on loopback recording every push; its URL and the pushes."""
    pushes: list[tuple[str, str, str]] = []
    handler = type("Handler", (Recorder,), {"pushes": pushes})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", pushes
    finally:
        server.shutdown()
        server.server_close()


def test_the_pushgateway_gets_the_run_grouped_by_job_and_a_skip_only_adds(
    migrated: str, connect: Connect, gateway: tuple[str, list[tuple[str, str, str]]]
) -> None:
    url, pushes = gateway
    job = new_job("cli-push")
    args = [*run_args(job, migrated), "--pushgateway", url, "--"]
    assert pgsolo_cli(*args, PY, "-c", "pass").returncode == 0
    holder = hold(connect, job)
    assert pgsolo_cli(*args, PY, "-c", "pass").returncode == 75
    unhold(holder, job)

    assert [(method, urllib.parse.unquote(path)) for method, path, _ in pushes] == [
        ("POST", f"/metrics/job/{job}")
    ] * 2
    completed, skipped = (body for _, _, body in pushes)
    assert (
        sample(completed, "pgsolo_job_attempts_total", job=job, outcome="completed", reason="") == 1
    )
    assert sample(completed, GAUGE, job=job) is not None
    # A POST replaces only the families it carries: the skip carries no last success, so
    # the Pushgateway keeps the one the completed run pushed.
    assert GAUGE not in skipped
    assert (
        sample(skipped, "pgsolo_job_attempts_total", job=job, outcome="skipped", reason="busy") == 1
    )


def test_an_unreachable_pushgateway_is_a_warning_and_the_exit_code_stays_the_commands(
    migrated: str,
) -> None:
    job = new_job("cli-push")
    done = pgsolo_cli(
        *run_args(job, migrated),
        "--pushgateway",
        "http://127.0.0.1:9",  # discard: nothing listens
        "--json",
        "--",
        PY,
        "-c",
        "raise SystemExit(3)",
    )
    assert done.returncode == 3
    assert "warning: metrics not published" in done.stderr
    assert done.stderr.splitlines()[-1].startswith("{")  # the JSON object still ends stderr


def test_a_pushgateway_failure_does_not_show_the_urls_password(migrated: str) -> None:
    """Guards the warning: prometheus_client's error quoted the URL's user:password part
    ("nonnumeric port: 's3cret-pw@...'"), which the usage errors blank."""
    done = pgsolo_cli(
        *run_args(new_job("cli-push"), migrated),
        "--pushgateway",
        "http://ops:s3cret-pw@pushgw.invalid",
        "--",
        PY,
        "-c",
        "pass",
    )
    assert done.returncode == 0, done.stderr
    assert "warning: metrics not published" in done.stderr
    assert "s3cret-pw" not in done.stderr
