"""``pgsolo dashboard``: its options, a database it cannot reach, and the extra missing."""

from __future__ import annotations

import socket
import sys

import pytest

from _support import main_in_process


def test_without_the_extra_it_says_what_to_install(
    db: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # what an install without it imports
    assert main_in_process(["dashboard", "--dsn", db]) == 2
    assert "pip install 'pgsolo[dashboard]'" in capsys.readouterr().err


def test_a_database_it_cannot_reach_is_exit_69_before_serving(
    capsys: pytest.CaptureFixture[str],
) -> None:
    unreachable = "postgresql://someone:s3cret-pw-77@127.0.0.1:1/nowhere?connect_timeout=2"
    assert main_in_process(["dashboard", "--dsn", unreachable, "--port", "1"]) == 69
    err = capsys.readouterr().err
    assert "database unavailable" in err
    assert "s3cret-pw-77" not in err


@pytest.mark.parametrize(
    "args",
    [
        ["--port", "0"],
        ["--refresh", "0"],
        ["--port", "http"],
        ["--semaphore", "exports"],
        ["--semaphore", "exports=0"],
        ["--registry", "/nonexistent/locks.toml"],
    ],
)
def test_bad_options_are_usage_errors(args: list[str]) -> None:
    """Refused before anything connects: the DSN given reaches no server."""
    unreachable = "postgresql://nobody@127.0.0.1:1/nowhere?connect_timeout=2"
    assert main_in_process(["dashboard", "--dsn", unreachable, *args]) == 2


@pytest.mark.parametrize(
    ("host", "given", "allowed"),
    [
        ("127.0.0.1", [], ["127.0.0.1", "localhost", "::1", "[::1]"]),
        ("::1", ["box"], ["::1", "[::1]", "box", "localhost", "127.0.0.1"]),
        ("192.0.2.7", [], ["192.0.2.7"]),
        ("dash.internal", ["*.example.com"], ["dash.internal", "*.example.com"]),
        ("0.0.0.0", [], None),  # noqa: S104 - reached by names pgsolo cannot know
        ("0.0.0.0", ["dash.example.com"], ["dash.example.com"]),  # noqa: S104
    ],
)
def test_the_host_names_the_dashboard_answers(
    host: str, given: list[str], allowed: list[str] | None
) -> None:
    from pgsolo.cli.dashboard import allowed_hosts  # noqa: PLC0415 - needs no extra

    assert allowed_hosts(host, given) == allowed


def test_a_port_it_cannot_serve_on_is_exit_1_said_plainly(
    db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Guards the documented exit codes: uvicorn's own exit, 3, came out as it was."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        assert main_in_process(["dashboard", "--dsn", db, "--port", port]) == 1
    assert "could not serve on 127.0.0.1:" in capsys.readouterr().err
