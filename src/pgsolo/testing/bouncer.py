"""A real PgBouncer on a loopback port in front of a server, in transaction or session
pooling mode: what a client behind a pooler sees, for tests and the chaos suite.

The binary is ``$PGSOLO_PGBOUNCER_BIN`` when it is set (a wrong value is a
:class:`~pgsolo.testing.SetupError`, so that CI cannot skip by mistake), else ``pgbouncer``
on the ``PATH`` or at ``/usr/sbin/pgbouncer``; with none, :class:`~pgsolo.testing.Unavailable`.
PgBouncer refuses to run as root: as root it runs as the owner of the server's socket
directory, else ``postgres``, else ``nobody``.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from ..drivers import driver_errors, is_unavailable
from ..drivers.connect import connect_psycopg
from ..drivers.conninfo import make_dsn
from ._ports import free_port
from .errors import SetupError, Unavailable

if TYPE_CHECKING:
    import psycopg

__all__ = ["POOL_SIZE", "Bouncer", "PoolMode", "bouncer_client", "running_bouncer"]

BINARY_ENV = "PGSOLO_PGBOUNCER_BIN"
PoolMode = Literal["transaction", "session"]
POOL_SIZE = 6  # server connections per (database, user) pair behind the bouncer
START_DEADLINE = 15.0  # bound for PgBouncer to start accepting connections
STOP_DEADLINE = 5.0  # per signal, when stopping it


@dataclass(frozen=True)
class Bouncer:
    """A running PgBouncer: ``dsn`` is what clients use (127.0.0.1:``port``, through it)."""

    dsn: str
    port: int
    pid: int
    log: Path


def _bouncer_binary() -> str | None:
    configured = os.environ.get(BINARY_ENV)
    if configured:  # CI says where it is: a missing binary must fail, not skip
        if not os.access(configured, os.X_OK):
            raise SetupError(f"{BINARY_ENV}={configured!r} is not an executable file")
        return configured
    found = shutil.which("pgbouncer")
    if found:
        return found
    return "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None


def _quote(value: str) -> str:
    """A value for PgBouncer's [databases] connection string (single quotes, '' inside)."""
    if not value or any(c in value for c in "\r\n\0"):
        raise ValueError(f"cannot pass {value!r} to PgBouncer's [databases] line")
    return "'" + value.replace("'", "''") + "'"


def _run_as(socket_dir: str | None) -> pwd.struct_passwd | None:
    """The unprivileged OS user to run PgBouncer as (it refuses to run as root).

    A unix-socket server (the embedded one) is reachable only by the owner of its socket
    directory, so that owner; otherwise ``postgres`` if it exists, else ``nobody``.
    """
    if os.geteuid() != 0:
        return None
    if socket_dir is not None:
        owner = os.stat(socket_dir).st_uid
        if owner != 0:
            return pwd.getpwuid(owner)
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name)
        except KeyError:
            continue
    raise SetupError("running as root, and neither a 'postgres' nor a 'nobody' user exists")


def _server_line(dsn: str) -> tuple[str, str | None, str, str]:
    """(the [databases] line's value, unix socket dir or None, database name, user).

    Taken from a real connection, so that defaults and PG* variables are resolved the way
    the other tests resolve them.
    """
    with connect_psycopg(dsn, autocommit=True, connect_timeout=10) as conn:
        info = conn.info
        host, port, dbname, user = info.host, info.port, info.dbname, info.user
        password = info.password
    socket_dir = host if host.startswith("/") else None
    parts = {"host": host, "port": str(port), "dbname": dbname, "user": user}
    if password:
        parts["password"] = password
    return " ".join(f"{k}={_quote(v)}" for k, v in parts.items()), socket_dir, dbname, user


def _log_tail(path: Path) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-30:])
    except OSError as exc:
        return f"(no log: {exc})"


def _stop(proc: subprocess.Popen[bytes]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(STOP_DEADLINE)
        except subprocess.TimeoutExpired:
            continue
        return


def _start(
    binary: str,
    workdir: Path,
    server: str,
    dbname: str,
    user: pwd.struct_passwd | None,
    pool_mode: PoolMode,
) -> tuple[subprocess.Popen[bytes], int]:
    port = free_port()
    ini = workdir / "pgbouncer.ini"
    ini.write_text(
        f"""[databases]
{dbname} = {server}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = any
pool_mode = {pool_mode}
default_pool_size = {POOL_SIZE}
min_pool_size = 0
reserve_pool_size = 0
max_client_conn = 100
ignore_startup_parameters = extra_float_digits
query_wait_timeout = 60
server_connect_timeout = 10
server_login_retry = 1
logfile = {workdir / "pgbouncer.log"}
"""
    )
    ini.chmod(0o600)
    if user is not None:
        for path in (workdir, ini):
            os.chown(path, user.pw_uid, user.pw_gid)
    with open(workdir / "stderr.log", "ab") as err:
        proc = subprocess.Popen(  # noqa: S603 - PgBouncer, on a configuration of our own
            [binary, str(ini)],
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=err,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            user=None if user is None else user.pw_uid,
            group=None if user is None else user.pw_gid,
            extra_groups=None if user is None else [],
        )
    return proc, port


def _wait_ready(proc: subprocess.Popen[bytes], dsn: str) -> str | None:
    """None once a client can run a statement through the bouncer; else why not."""
    deadline = time.monotonic() + START_DEADLINE
    last = "never tried"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return f"pgbouncer exited with status {proc.returncode}"
        try:
            with connect_psycopg(
                dsn, autocommit=True, prepare_threshold=None, connect_timeout=3
            ) as conn:
                conn.execute("SELECT 1").fetchone()
        except driver_errors() as exc:
            if not is_unavailable(exc):
                raise
            last = f"{exc}".strip()
            time.sleep(0.05)
        else:
            return None
    return f"not accepting connections after {START_DEADLINE}s: {last}"


@contextmanager
def running_bouncer(dsn: str, pool_mode: PoolMode = "transaction") -> Iterator[Bouncer]:
    """A real PgBouncer in ``pool_mode`` in front of the server of ``dsn``, stopped (and its
    files deleted) afterwards."""
    binary = _bouncer_binary()
    if binary is None:
        raise Unavailable(
            "pgbouncer is not installed (no PGSOLO_PGBOUNCER_BIN, none on PATH nor at"
            " /usr/sbin/pgbouncer); CI installs Debian's package and runs these tests"
        )
    server, socket_dir, dbname, server_user = _server_line(dsn)
    user = _run_as(socket_dir)
    workdir = Path(tempfile.mkdtemp(prefix="pgsolo-pgbouncer-"))
    workdir.chmod(0o700)
    proc: subprocess.Popen[bytes] | None = None
    try:
        problem = "not started"
        for _attempt in range(3):  # a free port can be taken before PgBouncer binds it
            proc, port = _start(binary, workdir, server, dbname, user, pool_mode)
            client_dsn = make_dsn(host="127.0.0.1", port=port, dbname=dbname, user=server_user)
            problem = _wait_ready(proc, client_dsn) or ""
            if not problem:
                break
            exited = proc.poll() is not None
            _stop(proc)
            proc = None
            if not exited:
                break  # running but unusable: another port would not help
        if proc is None:
            log = _log_tail(workdir / "pgbouncer.log") + "\n" + _log_tail(workdir / "stderr.log")
            raise SetupError(f"PgBouncer ({binary}) did not start: {problem}\n{log}")
        yield Bouncer(client_dsn, port, proc.pid, workdir / "pgbouncer.log")
    finally:
        if proc is not None:
            _stop(proc)
        shutil.rmtree(workdir, ignore_errors=True)


def bouncer_client(bouncer: Bouncer, **kwargs: Any) -> psycopg.Connection[Any]:
    """A client connection through ``bouncer`` (autocommit; no prepared statements,
    which PgBouncer before 1.21 cannot pool)."""
    options: dict[str, Any] = {"autocommit": True, "prepare_threshold": None}
    options.update(kwargs)
    return connect_psycopg(bouncer.dsn, connect_timeout=10, **options)
