"""Every connection string a user can give (``run_job(dsn, ...)``, ``pgsolo run --dsn``),
fuzzed: garbage, key=value with odd quoting, URIs with odd characters, passwords with
special characters. The job either runs, or fails with :class:`pgsolo.InvalidDsnError` or
:class:`pgsolo.DatabaseUnavailableError`; and the password is never shown, in the error,
in its chained causes (what a traceback prints), in a log record, or on the command
line's output.

Every string that would connect anywhere names ``hostaddr=127.0.0.1``: libpq then looks no
host name up (whatever the host part turned into), and connects to port 1, where nothing
listens, or to the test server."""

from __future__ import annotations

import logging
import traceback
import urllib.parse

import pytest
from hypothesis import given
from hypothesis import strategies as st
from psycopg.conninfo import make_conninfo

import pgsolo
from _support import (
    HOSTILE_TEXT,
    cli_env,
    examples,
    fuzz,
    main_in_process,
    pgsolo_cli,
    unique_name,
)

# The password's three markers: text that appears nowhere else, so any part of the
# password that leaks shows one of them.
MARKERS = ("Xq7", "Wv4", "Zk2")
SPECIALS = " '\"\\=@:/%?#&;+,é東\t$"
PASSWORDS = st.builds(
    lambda a, b: f"{MARKERS[0]}{a}{MARKERS[1]}{b}{MARKERS[2]}",
    st.text(SPECIALS, max_size=6),
    st.text(SPECIALS, max_size=3),
)
NOWHERE = "hostaddr=127.0.0.1 port=1 connect_timeout=2"


def quoted(value: str) -> str:
    """A libpq key=value value, quoted the right way."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


KEY_VALUE_PASSWORDS = [
    lambda pw: f"password={quoted(pw)}",  # right
    lambda pw: f"password={pw}",  # unquoted: breaks at the first blank or quote
    lambda pw: f"password='{pw}",  # unterminated
    lambda pw: f"password='{pw}'",  # quotes inside not escaped
    lambda pw: f"password = {quoted(pw)}",
    lambda pw: f"PASSWORD={quoted(pw)}",  # not a libpq keyword
    lambda pw: f"host= password={pw}",  # the password read as the host
    lambda pw: f"port= password={pw}",  # ... or as the port
    lambda pw: f"sslpassword={quoted(pw)}",
]
URI_USERINFO = [
    lambda pw: "u:" + urllib.parse.quote(pw, safe=""),  # right
    lambda pw: "u:" + pw,  # not encoded
    lambda pw: "u:" + urllib.parse.quote(pw, safe="") + "%zz",  # a broken escape
    lambda pw: ":" + urllib.parse.quote(pw, safe=""),  # no user name
    lambda pw: "u:" + urllib.parse.quote(pw),  # "/" left as it is
]
SCHEMES = ["postgresql://", "postgres://", "POSTGRESQL://", "postgresql+psycopg://", "pg://"]


SERVER = "<the test server>"  # stands for the test server's string, with the password


@st.composite
def dsns_with_a_password(draw: st.DrawFn) -> tuple[str, str]:
    """(a connection string, the password in it) of one of the shapes users write;
    :data:`SERVER`, for the test server's (see :func:`on`)."""
    pw = draw(PASSWORDS)
    shape = draw(st.sampled_from(["key=value", "uri", "garbage", "server"]))
    if shape == "key=value":
        pair = draw(st.sampled_from(KEY_VALUE_PASSWORDS))(pw)
        parts = [pair, "user=u", "dbname=d", NOWHERE]
        dsn = " ".join(draw(st.permutations(parts)))
    elif shape == "uri":
        scheme = draw(st.sampled_from(SCHEMES))
        userinfo = draw(st.sampled_from(URI_USERINFO))(pw)
        host = draw(st.sampled_from(["127.0.0.1:1", "", "[::1]:1", "h:x"]))
        dsn = f"{scheme}{userinfo}@{host}/d?{NOWHERE.replace(' ', '&')}"
    elif shape == "garbage":
        dsn = draw(HOSTILE_TEXT) + pw + draw(HOSTILE_TEXT)
    else:
        dsn = SERVER
    return dsn, pw


def on(server: str, example: tuple[str, str]) -> tuple[str, str]:
    """``example`` with :data:`SERVER` made the test server's string, with the password
    (which it may or may not ask for)."""
    dsn, pw = example
    return (make_conninfo(server, password=pw, connect_timeout="2") if dsn == SERVER else dsn), pw


# What the properties found (each a password shown, or a traceback, before the fix):
FOUND = [
    # a password with an '@' and a '/' libpq reads as a host or a database name
    ("postgresql://u:Xq7Wv4@Zk2@127.0.0.1:1/d?hostaddr=127.0.0.1&port=1", "Xq7Wv4@Zk2"),
    ("postgresql://u:Xq7Wv4,/Zk2@127.0.0.1:1/d?hostaddr=127.0.0.1&port=1", "Xq7Wv4,/Zk2"),
    # a lone surrogate (an undecodable byte of a command line): UnicodeEncodeError
    ("Xq7Wv4Zk2\ud800", "Xq7Wv4Zk2"),
    ("host=127.0.0.1 port=1 password=Xq7Wv4Zk2\udce9", "Xq7Wv4Zk2\udce9"),
    # a NUL: libpq stops there and connects with its defaults; the rest was quoted
    ("\x00Xq7Wv4Zk2", "Xq7Wv4Zk2"),
    # a password with a '?' before its '@', which looked like the start of the query
    ("postgresql://u:Xq7?Wv4@Zk2@127.0.0.1:1/d?hostaddr=127.0.0.1&port=1", "Xq7?Wv4@Zk2"),
    # a password given as the connection string, which reads as a URI: its "scheme" named
    ("Xq7Wv4://Zk2", "Xq7Wv4://Zk2"),
]


def in_argv(example: tuple[str, str]) -> bool:
    """Whether a process can be given this string as an argument (no NUL, and no
    surrogate that does not stand for an undecodable byte)."""
    try:
        example[0].encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return "\0" not in example[0]


def assert_hidden(password: str, *texts: str) -> None:
    for text in texts:
        for marker in MARKERS:
            assert marker not in text, f"the password ({password!r}) shows in {text!r}"


@fuzz(60)
@given(dsns_with_a_password())
@examples(FOUND)
def test_a_job_on_any_connection_string_runs_or_fails_typed_without_showing_the_password(
    db: str, caplog: pytest.LogCaptureFixture, example: tuple[str, str]
) -> None:
    dsn, password = on(db, example)
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        try:
            result = pgsolo.run_job(dsn, unique_name("fuzz-dsn"), lambda c: "ran")
        except (pgsolo.InvalidDsnError, pgsolo.DatabaseUnavailableError) as exc:
            shown = "".join(traceback.format_exception(exc))
            assert_hidden(password, str(exc), shown)
        else:
            assert (result.outcome, result.value) == ("completed", "ran")
    assert_hidden(password, caplog.text)


@fuzz(6)
@given(dsns_with_a_password().filter(in_argv))
@examples([FOUND[0], FOUND[3]])
def test_pgsolo_run_on_any_connection_string_exits_plainly_without_showing_the_password(
    db: str, example: tuple[str, str]
) -> None:
    """Through a real process (slow: a handful of examples): exit 0, 2 or 69 with a
    one-line message, never a traceback, never the password."""
    dsn, password = on(db, example)
    key = unique_name("fuzz-dsn-cli")
    done = pgsolo_cli("run", "--key", key, "--dsn", dsn, "-vv", "--", "true", env=cli_env())
    assert done.returncode in (0, 2, 69), done.stderr
    assert "Traceback" not in done.stderr
    assert_hidden(password, done.stdout, done.stderr)


@fuzz(40)
@given(dsns_with_a_password())
@examples(FOUND)
def test_pgsolo_run_in_process_on_any_connection_string_hides_the_password(
    db: str,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    example: tuple[str, str],
) -> None:

    for name in ("PGSOLO_DSN", "DATABASE_URL"):
        monkeypatch.delenv(name, raising=False)
    dsn, password = on(db, example)
    caplog.clear()
    with caplog.at_level(logging.DEBUG):
        code = main_in_process(
            ["run", "--key", unique_name("fuzz"), "--dsn", dsn, "-v", "--", "true"]
        )
    out, err = capsys.readouterr()
    assert code in (0, 2, 69), err
    assert "Traceback" not in err
    assert_hidden(password, out, err, caplog.text)
