"""Connection strings in libpq's grammar: parsed, merged with pgsolo's defaults, and
shown without secrets.

Anything shown to a person (CLI output, errors, logs) goes through :func:`redact_dsn` or
:func:`scrub_secrets` first: a password never leaves this process in clear. The libpq
parameters pgsolo adds to the connections it opens itself (:func:`connection_settings`)
never override what the connection string says.
"""

from __future__ import annotations

import functools
import math
import os
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import quote, quote_plus, unquote

from ..dsn import DEFAULT_CONNECT_TIMEOUT, EMBEDDED, libpq_dsn, uri_scheme
from ..errors import DatabaseUnavailableError, InvalidArgumentError, InvalidDsnError, PgsoloError

if TYPE_CHECKING:
    import psycopg
    from psycopg.abc import ConnDict

# psycopg (libpq's parser) is imported by the functions that use it, when a connection
# string is first read: the command line imports this module to parse its arguments, and
# `pgsolo run --help` must not pay for loading libpq (about 0.1 s).

__all__ = [
    "DEFAULT_ANSWER_TIMEOUT",
    "DEFAULT_APP_PREFIX",
    "DEFAULT_CONNECT_TIMEOUT",
    "application_name_for",
    "connect_error",
    "connection_settings",
    "conninfo_for",
    "make_dsn",
    "parse_dsn",
    "redact_dsn",
    "scrub_secrets",
    "server_keepalives",
]

REDACTED = "***"


# libpq parameters whose value is a secret.
SECRET_KEYS = frozenset({"password", "sslpassword"})


# A key=value pair whose key is a secret: the value is a quoted string with backslash
# escapes, or a run of non-blanks (libpq's conninfo grammar).
_SECRET_PAIR = re.compile(
    r"(?P<head>(?:^|(?<=\s))(?:ssl)?password\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*'?|(?:[^\s\\]|\\.)+)",
    re.IGNORECASE,
)


def _libpq_params(dsn: str) -> ConnDict | None:
    """libpq's reading of ``dsn``, or None for a string it cannot read: a syntax error,
    or text that is not valid Unicode (a lone surrogate, which is what an undecodable
    byte of a command line or of the environment becomes in Python) and so cannot even
    be handed to libpq."""
    read = _read_by_libpq(dsn)
    return None if read is None else dict(read)  # the caller's own copy to change


# libpq's parse costs about 60 us and reads nothing but the string, and a job or task
# that opens a connection per run reads the same string several times a run.
@functools.lru_cache(maxsize=64)
def _read_by_libpq(dsn: str) -> ConnDict | None:
    import psycopg  # noqa: PLC0415 - see the top of this module
    from psycopg.conninfo import conninfo_to_dict  # noqa: PLC0415

    try:
        return conninfo_to_dict(libpq_dsn(dsn)) if dsn else {}
    except (psycopg.Error, UnicodeEncodeError, InvalidDsnError):
        return None


# libpq's options that take one of a few words: any other value is the caller's mistake.
_CHOICES = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "target_session_attrs": (
        "any", "read-write", "read-only", "primary", "standby", "prefer-standby",
    ),
    "load_balance_hosts": ("disable", "random"),
    "sslnegotiation": ("postgres", "direct"),
    "sslcertmode": ("disable", "allow", "require"),
}  # fmt: skip


def parse_dsn(dsn: str) -> ConnDict:
    """The parameters of ``dsn`` (a URI or key=value string, possibly multi-host), or
    :class:`~pgsolo.InvalidDsnError` for one libpq would refuse. The message never
    quotes the string: the part that could not be read may be a password. A URI's
    scheme may name a driver, as SQLAlchemy's do (:func:`~pgsolo.dsn.libpq_dsn`)."""
    if "\0" in dsn:
        # libpq reads a C string: it would stop at the NUL and connect with its defaults,
        # and the rest (possibly a password) would show wherever the string is quoted.
        raise InvalidDsnError(
            "the connection string contains a NUL character (its text is not shown: it may"
            " contain a password)"
        )
    libpq_dsn(dsn)  # a URI of another database: its own error, with the schemes to use
    params = _libpq_params(dsn)
    if params is None:
        scheme = uri_scheme(dsn) or ""
        hint = (
            " (a driver's own URI parameters are not libpq's: asyncpg's ssl=... is sslmode=...)"
            if "+" in scheme
            else ""
        )
        raise InvalidDsnError(
            "the connection string cannot be parsed (libpq's message is not shown: it may"
            f" contain a password){hint}"
        )
    for option, choices in _CHOICES.items():
        if (value := params.get(option)) is not None and value not in choices:
            # libpq refuses it only as it connects, which would read as "database
            # unavailable" (retry later), where it is the caller's mistake.
            raise InvalidDsnError(
                f"{option} must be one of {', '.join(choices)} (its value is not shown: it"
                " may be a password)"
            )
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            # Not quoted: in "port= password=..." libpq reads the password as the port.
            raise InvalidDsnError(
                "the connection string's port is not a port number from 1 to 65535 (its"
                " value is not shown: it may be a password)"
            )
    return params


def make_dsn(dsn: str = "", /, **params: str | int | None) -> str:
    """``dsn`` with ``params`` set over what it says, as one key=value string in libpq's
    grammar (a value with blanks or quotes is quoted so that libpq reads it back as is)."""
    from psycopg.conninfo import make_conninfo  # noqa: PLC0415 - see the top of this module

    return make_conninfo(libpq_dsn(dsn), **params)


def redact_dsn(dsn: str) -> str:
    """``dsn`` with every password replaced by ``***``; everything else is kept.

    Handles URIs (``postgresql://user:pw@host/db?password=...``) and key=value strings
    (``host=h password=pw``), including ``sslpassword``. The result is checked against
    libpq's own parse of ``dsn``: if a secret would still show, the string is rebuilt
    from the parsed parameters instead.
    """
    if not dsn or dsn.strip().lower() == EMBEDDED:
        return dsn
    params = _libpq_params(dsn)  # None: not valid; redact by pattern, best effort
    if uri_scheme(dsn) is not None:
        redacted = _redact_uri(dsn)
    else:
        redacted = _SECRET_PAIR.sub(lambda m: m.group("head") + REDACTED, dsn)
    if params is not None:
        secrets = [str(params[k]) for k in SECRET_KEYS if params.get(k)]
        if any(secret in redacted for secret in secrets):
            # Rebuilt with every value that shows a secret blanked out, not only the
            # secret's own: a password that is also another option's value (sslmode=...)
            # would show there.
            safe = {
                k: (REDACTED if v and any(s in str(v) for s in secrets) else v)
                for k, v in params.items()
            }
            return make_dsn("", **safe)
    return redacted


def _redact_uri(uri: str) -> str:
    scheme, _, rest = uri.partition("://")
    userinfo = ""
    if (split := _split_userinfo(rest)) is not None:
        userinfo, rest = split
        user, colon, password = userinfo.partition(":")
        if colon and password:
            userinfo = f"{user}:{REDACTED}"
        userinfo += "@"
    location, question, query = rest.partition("?")
    if question:
        pairs = []
        for pair in query.split("&"):
            name, equals, _value = pair.partition("=")
            if equals and unquote(name).strip().lower() in SECRET_KEYS:
                pair = f"{name}={REDACTED}"  # noqa: PLW2901
            pairs.append(pair)
        query = "&".join(pairs)
    return f"{scheme}://{userinfo}{location}{question}{query}"


def _split_userinfo(rest: str) -> tuple[str, str] | None:
    """(user info, the rest) of a URI after its ``scheme://``, or None without one.

    libpq's user info runs up to the first '@' before any '/' ('?' included). A password
    written without percent-encoding may hold '@', '/' or '?' too, and libpq then reads
    its pieces as a host, a port or a database name: so the user info is taken up to the
    last '@' before the query, when that is further, as the user meant it. The query is
    the first '?' after the path's '/' that follows the first '@' (a '?' before it is the
    password's), or the first '?' when no '/' follows an '@'.
    """
    libpq = re.match(r"[^@/]*@", rest)
    first_at = rest.find("@")
    path = rest.find("/", first_at) if first_at >= 0 else -1
    query = rest.find("?", path) if path >= 0 else rest.find("?")
    at = max(libpq.end() - 1 if libpq else -1, rest[: query if query >= 0 else None].rfind("@"))
    return None if at < 0 else (rest[:at], rest[at + 1 :])


def scrub_secrets(message: str, dsn: str) -> str:
    """``message`` (say, a driver error) with any secret of ``dsn`` blanked out."""
    secrets: set[str] = set()
    params = _libpq_params(dsn) if dsn.strip().lower() != EMBEDDED else {}
    secrets.update(str(params[k]) for k in SECRET_KEYS if params and params.get(k))
    for match in _SECRET_PAIR.finditer(dsn):
        secrets.add(match.group("value").strip("'"))
    if uri_scheme(dsn) is not None:
        split = _split_userinfo(dsn.partition("://")[2])
        if split and ":" in split[0]:
            password = split[0].partition(":")[2]
            secrets.update({password, unquote(password)})
            # libpq cuts a password holding '@' unencoded at the first one and reads the
            # rest as the host: a driver's message about that host quotes the pieces.
            secrets.update(piece for piece in password.split("@") if piece)
    # As a URI carries each one, percent-encoded (the whole URI quoted in an error).
    secrets.update(encoded for secret in set(secrets) for encoded in _uri_forms(secret))
    if dsn and dsn in message:
        message = message.replace(dsn, redact_dsn(dsn))
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        message = _whole(secret).sub(REDACTED, message)
    return message


def _uri_forms(secret: str) -> set[str]:
    """``secret`` percent-encoded as URIs are written: every reserved character, or all
    but ``/``, or a form's (``+`` for a space)."""
    return {quote(secret, safe=""), quote(secret), quote_plus(secret)}


def _whole(secret: str) -> re.Pattern[str]:
    """``secret`` wherever it stands on its own: not where its first or last letter or
    digit runs on into another (a password ``p`` is not the p of "port")."""
    before = r"(?<!\w)" if secret[0].isalnum() else ""
    after = r"(?!\w)" if secret[-1].isalnum() else ""
    return re.compile(before + re.escape(secret) + after)


DEFAULT_APP_PREFIX = "pgsolo:"


MAX_APPLICATION_NAME = 63  # PostgreSQL truncates longer names (NAMEDATALEN - 1)


DEFAULT_ANSWER_TIMEOUT = 30.0  # seconds the server has to answer each of pgsolo's statements


KEEPALIVE_BASIS = 10.0  # seconds; what TCP keepalives are sized from by default


_KEEPALIVE_PROBES = 3


def application_name_for(dsn: str, default: str, explicit: str | None = None) -> str:
    """The name a connection shows in ``pg_stat_activity``: an explicit one, else one
    already in the DSN or in ``PGAPPNAME``, else pgsolo's default."""
    if explicit:
        return _sendable(explicit, "the application name (application_name=, --application-name)")
    given = (_libpq_params(dsn) or {}).get("application_name")
    if given:
        return _sendable(str(given), "the connection string's application_name")[
            :MAX_APPLICATION_NAME
        ]
    if from_environment := os.environ.get("PGAPPNAME"):
        return _sendable(from_environment, "PGAPPNAME")[:MAX_APPLICATION_NAME]
    return default[:MAX_APPLICATION_NAME]


def _sendable(name: str, what: str) -> str:
    """``name``, if libpq can send it: text of Unicode (not the bytes of another encoding,
    which arrive as lone surrogates) without NUL; otherwise InvalidArgumentError."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        shown = name.encode("utf-8", "surrogateescape").decode("ascii", "backslashreplace")
        raise InvalidArgumentError(f"{what} must be valid Unicode text, got {shown!r}") from None
    if "\0" in name:
        raise InvalidArgumentError(f"{what} must not contain NUL")
    return name


SERVER_KEEPALIVE_PROBES = 4


def server_keepalives(check_timeout: float = KEEPALIVE_BASIS) -> dict[str, int]:
    """How the server's side of pgsolo's own connections gives a silent client up: about
    1.3 x ``check_timeout`` after the last packet it sent (13 s by default), when its
    session ends and its session locks with it. libpq's keepalives tell pgsolo that the
    server is gone; these tell the server that pgsolo is: without them, a leader whose
    host or network is cut keeps its lock for the kernel's default, 2 h 11 min on Linux.
    Later than the holder's own keeper gives the lock up (a beat plus ``check_timeout``,
    11 s by default), so that a cut leader stops before its successor starts."""
    idle = max(1, math.ceil(check_timeout / 2))
    interval = max(1, math.ceil(check_timeout / 5))
    gives_up = idle + interval * SERVER_KEEPALIVE_PROBES
    return {
        "tcp_keepalives_idle": idle,
        "tcp_keepalives_interval": interval,
        "tcp_keepalives_count": SERVER_KEEPALIVE_PROBES,
        "tcp_user_timeout": gives_up * 1000,
    }


def keepalive_basis_outlasting(seconds: float) -> float:
    """The ``check_timeout`` whose :func:`server_keepalives` give a silent client up later
    than ``seconds`` after the last packet the server heard from it (they give up after
    at least 1.3 x ``check_timeout``): for a holder whose keeper gives its lock up within
    ``seconds``, so that a holder cut off stops before the server lets another in.
    KEEPALIVE_BASIS for the 11 s of the keeper's defaults."""
    return seconds / 1.2


def connection_settings(
    check_timeout: float = KEEPALIVE_BASIS, *, connect_timeout: float | None = None
) -> dict[str, str]:
    """libpq parameters for pgsolo's own connections: TCP keepalives sized from how long
    the server may take to answer (``pgsolo run --check-timeout``) notice a dead peer on
    an idle connection, ``tcp_user_timeout`` one that stops acknowledging what pgsolo
    sends (both ignored on a unix socket), and ``connect_timeout`` bounds each attempt
    to connect. What the connection string sets itself wins, and so does
    ``PGCONNECT_TIMEOUT`` over pgsolo's default (not over an explicit ``connect_timeout``).
    """
    settings = {
        "keepalives": "1",
        "keepalives_idle": str(max(1, math.ceil(check_timeout / 2))),
        "keepalives_interval": str(max(1, math.ceil(check_timeout / (2 * _KEEPALIVE_PROBES)))),
        "keepalives_count": str(_KEEPALIVE_PROBES),
        "tcp_user_timeout": str(max(1, math.ceil(check_timeout * 1000))),
    }
    if connect_timeout is not None:
        settings["connect_timeout"] = str(max(1, math.ceil(connect_timeout)))
    elif not os.environ.get("PGCONNECT_TIMEOUT"):
        settings["connect_timeout"] = str(DEFAULT_CONNECT_TIMEOUT)
    return settings


def conninfo_for(dsn: str, application_name: str, defaults: Mapping[str, str] | None = None) -> str:
    """``dsn`` with pgsolo's name for the connection and the ``defaults`` it leaves
    unset (what it says itself wins)."""
    if defaults is None:
        defaults = connection_settings()  # read now: it follows the environment
    return _conninfo(dsn, application_name, tuple(defaults.items()))


# Three parses of libpq's (about 0.25 ms), the same for every run of a job or task that
# opens a connection per run from one connection string.
@functools.lru_cache(maxsize=64)
def _conninfo(dsn: str, application_name: str, defaults: tuple[tuple[str, str], ...]) -> str:
    given = parse_dsn(dsn)
    extra = {k: v for k, v in defaults if given.get(k) in (None, "")}
    extra["application_name"] = application_name[:MAX_APPLICATION_NAME]
    return make_dsn(dsn, **extra)


def connect_error(exc: psycopg.Error, dsn: str, conninfo: str) -> PgsoloError:
    """What a failed connect to ``dsn`` (with pgsolo's ``conninfo``) means, without its
    secrets; raise it outside the ``except`` that caught ``exc``. psycopg's error is
    never its cause or context: its message may quote a password, and it keeps the
    connection's ``pgconn``, whose ``info`` holds the password in clear (for an error
    tracker or a debugger to show). Its cause is a copy of that error with the message
    blanked as pgsolo's own is (none for a parameter libpq does not take)."""
    import psycopg  # noqa: PLC0415 - see the top of this module
    from psycopg.conninfo import conninfo_to_dict, timeout_from_conninfo  # noqa: PLC0415

    if isinstance(exc, psycopg.ProgrammingError):  # a parameter libpq does not take
        return InvalidDsnError(
            "the connection string cannot be used (libpq's message is not shown: it may"
            " contain a password)"
        )
    said = scrub_secrets(" ".join(str(exc).split()), dsn)
    message = said
    if isinstance(exc, psycopg.errors.ConnectionTimeout):
        message += f" (connect_timeout {timeout_from_conninfo(conninfo_to_dict(conninfo))}s)"
    error = DatabaseUnavailableError(
        f"cannot connect to {redact_dsn(dsn) or 'the libpq defaults'}: {message}"
    )
    error.__cause__ = type(exc)(said)
    return error
