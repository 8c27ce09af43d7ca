"""Connection strings: which one a command uses (DESIGN §5), and how to show one safely.

Resolution for every command: ``--dsn`` > ``PGSOLO_DSN`` > ``DATABASE_URL`` > libpq
defaults (``PGHOST``, ``PGPORT``, ...). The value ``embedded`` starts or reuses the local
server of :mod:`pgsolo.embedded`; it is never picked silently.

Anything shown to a person (CLI output, errors, logs) goes through :func:`redact_dsn` or
:func:`scrub_secrets` first: a password never leaves this process in clear.
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from urllib.parse import unquote

import psycopg
from psycopg.abc import ConnDict
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from .errors import InvalidDsnError

__all__ = [
    "DSN_ENV_VARS",
    "EMBEDDED",
    "DsnChoice",
    "choose_dsn",
    "parse_dsn",
    "redact_dsn",
    "resolved_dsn",
    "scrub_secrets",
]

EMBEDDED = "embedded"
DSN_ENV_VARS = ("PGSOLO_DSN", "DATABASE_URL")
REDACTED = "***"
# libpq parameters whose value is a secret.
SECRET_KEYS = frozenset({"password", "sslpassword"})
_URI_PREFIXES = ("postgresql://", "postgres://")
# A key=value pair whose key is a secret: the value is a quoted string with backslash
# escapes, or a run of non-blanks (libpq's conninfo grammar).
_SECRET_PAIR = re.compile(
    r"(?P<head>(?:^|(?<=\s))(?:ssl)?password\s*=\s*)(?P<value>'(?:[^'\\]|\\.)*'?|(?:[^\s\\]|\\.)+)",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class DsnChoice:
    """The connection string a command will use, and where it came from."""

    dsn: str  # "" means libpq defaults
    source: str  # "--dsn", "PGSOLO_DSN", "DATABASE_URL" or "libpq defaults"

    @property
    def embedded(self) -> bool:
        return self.dsn.strip().lower() == EMBEDDED

    def display(self) -> str:
        """A description that is safe to print."""
        if self.embedded:
            return "the embedded server"
        if not self.dsn:
            return "libpq defaults (PGHOST, PGPORT, PGDATABASE, ...)"
        return redact_dsn(self.dsn)


def choose_dsn(
    flag: str | None,
    *,
    environ: Mapping[str, str] | None = None,
    default: str | None = None,
) -> DsnChoice:
    """Pick the connection string: ``--dsn`` > ``PGSOLO_DSN`` > ``DATABASE_URL`` > libpq.

    ``default`` replaces the environment and libpq steps: ``pgsolo demo`` passes
    ``"embedded"`` so that it never drops and creates tables in a database the user did
    not name on its command line. Empty variables count as unset.
    """
    if flag:
        return DsnChoice(flag, "--dsn")
    if default is not None:
        return DsnChoice(default, "default")
    env = os.environ if environ is None else environ
    for name in DSN_ENV_VARS:
        if value := env.get(name):
            return DsnChoice(value, name)
    return DsnChoice("", "libpq defaults")


def parse_dsn(dsn: str) -> ConnDict:
    """The parameters of ``dsn`` (a URI or key=value string, possibly multi-host), or
    :class:`~pgsolo.InvalidDsnError` for one libpq would refuse. The message never
    quotes the string: the part that could not be read may be a password."""
    try:
        params = conninfo_to_dict(dsn) if dsn else {}
    except psycopg.Error:
        raise InvalidDsnError(
            "the connection string cannot be parsed (libpq's message is not shown: it may"
            " contain a password)"
        ) from None
    for port in str(params.get("port") or "").split(","):
        if port and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            # Not quoted: in "port= password=..." libpq reads the password as the port.
            raise InvalidDsnError(
                "the connection string's port is not a port number from 1 to 65535 (its"
                " value is not shown: it may be a password)"
            )
    return params


@contextmanager
def resolved_dsn(choice: DsnChoice) -> Iterator[str]:
    """Yield a connection string psycopg can use; starts the embedded server if asked.

    The embedded server keeps running afterwards (``cleanup=None``) so the next command
    reuses it at once.
    """
    if not choice.embedded:
        yield choice.dsn
        return
    from .embedded import embedded_server  # noqa: PLC0415 - needs the optional extra

    with ExitStack() as stack:
        with warnings.catch_warnings():
            # platformdirs warns when XDG_RUNTIME_DIR is unset; pgserver copes with it.
            warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR")
            uri = stack.enter_context(embedded_server(cleanup=None))
        yield uri


def redact_dsn(dsn: str) -> str:
    """``dsn`` with every password replaced by ``***``; everything else is kept.

    Handles URIs (``postgresql://user:pw@host/db?password=...``) and key=value strings
    (``host=h password=pw``), including ``sslpassword``. The result is checked against
    libpq's own parse of ``dsn``: if a secret would still show, the string is rebuilt
    from the parsed parameters instead.
    """
    if not dsn or dsn.strip().lower() == EMBEDDED:
        return dsn
    try:
        params: ConnDict | None = conninfo_to_dict(dsn)
    except psycopg.Error:
        params = None  # not valid; redact by pattern, best effort
    if dsn.startswith(_URI_PREFIXES):
        redacted = _redact_uri(dsn)
    else:
        redacted = _SECRET_PAIR.sub(lambda m: m.group("head") + REDACTED, dsn)
    if params is not None:
        secrets = [str(params[k]) for k in SECRET_KEYS if params.get(k)]
        if any(secret in redacted for secret in secrets):
            safe = {k: (REDACTED if k in SECRET_KEYS and v else v) for k, v in params.items()}
            return make_conninfo("", **safe)
    return redacted


def _redact_uri(uri: str) -> str:
    scheme, _, rest = uri.partition("://")
    # Like libpq: user info is whatever precedes the first '@' that comes before any '/'.
    userinfo = ""
    if (match := re.match(r"[^@/]*@", rest)) is not None:
        userinfo, rest = match.group()[:-1], rest[match.end() :]
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


def scrub_secrets(message: str, dsn: str) -> str:
    """``message`` (say, a driver error) with any secret of ``dsn`` blanked out."""
    secrets: set[str] = set()
    try:
        params = conninfo_to_dict(dsn) if dsn and dsn.strip().lower() != EMBEDDED else {}
        secrets.update(str(params[k]) for k in SECRET_KEYS if params.get(k))
    except psycopg.Error:
        pass
    for match in _SECRET_PAIR.finditer(dsn):
        secrets.add(match.group("value").strip("'"))
    if dsn.startswith(_URI_PREFIXES):
        head = re.match(r"[^:]*://([^@/]*)@", dsn)
        if head and ":" in head.group(1):
            password = head.group(1).partition(":")[2]
            secrets.update({password, unquote(password)})
    if dsn and dsn in message:
        message = message.replace(dsn, redact_dsn(dsn))
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        message = message.replace(secret, REDACTED)
    return message
