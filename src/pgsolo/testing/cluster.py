"""Real PostgreSQL servers in replication: a primary and a streaming hot standby on
loopback ports, built from the server binaries (Debian's packages in CI).

:func:`replica_pair` builds a private pair, which its user may stop and promote, in about
two seconds with ``initdb``, ``pg_basebackup -R`` and ``pg_ctl``, and always deletes it
afterwards. :class:`Replicas` is a pair given by its connection strings (what CI runs, or a
private pair shared by a whole session, whose roles nobody may change).

The binaries come from ``$PGSOLO_PG_BIN`` when it is set (a wrong value is a
:class:`~pgsolo.testing.SetupError`), else from the newest ``/usr/lib/postgresql/*/bin``
that has them; with none, :class:`~pgsolo.testing.Unavailable`. The server refuses to run
as root, so as root every server command runs as the ``postgres`` OS user (else
``nobody``), with the data directories in a temporary directory that user owns.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from ..drivers.connect import connect_psycopg
from ..drivers.conninfo import make_dsn, parse_dsn
from ._ports import free_port
from .errors import SetupError, Unavailable

if TYPE_CHECKING:
    import psycopg

__all__ = ["ReplicaPair", "Replicas", "replica_pair", "server_binaries"]

PG_BIN_ENV = "PGSOLO_PG_BIN"
DEBIAN_BINARIES = Path("/usr/lib/postgresql")
NEEDED = ("initdb", "pg_ctl", "pg_basebackup", "postgres")

START_DEADLINE = 60  # seconds for pg_ctl to start, stop or promote a server
STREAM_DEADLINE = 30.0  # for a new standby to stream, and for it to replay the primary's WAL
CONNECT_OPTIONS: dict[str, Any] = {"autocommit": True, "connect_timeout": 10}
STARTS = 3  # a free port can be taken before the server binds it: try another

# Appended to the primary's postgresql.conf; pg_basebackup copies it to the standby.
SERVER_CONF = """
# --- pgsolo test pair ---
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
max_connections = 60
shared_buffers = 16MB
# private and thrown away: durability is not needed, speed is (synchronous_commit stays
# on, so that a commit is in the WAL the standby receives when it returns)
fsync = off
full_page_writes = off
wal_level = replica
max_wal_senders = 5
wal_keep_size = 128MB
hot_standby = on
"""


# -- a pair given by its connection strings ----------------------------------------------


@dataclass
class Replicas:
    """A primary and a hot standby streaming from it, each reachable over TCP."""

    primary_dsn: str
    standby_dsn: str

    @property
    def primary_port(self) -> int:
        return _endpoint(self.primary_dsn)[1]

    @property
    def standby_port(self) -> int:
        return _endpoint(self.standby_dsn)[1]

    def multi_host_dsn(self, *, read_write: bool = True, url: bool = False) -> str:
        """One connection string that lists the standby first, then the primary.

        With ``read_write`` it asks for ``target_session_attrs=read-write``, so libpq
        skips a server in recovery and lands on the primary; without it, the first
        server that answers (the standby) is the one. ``url`` spells it as
        ``postgresql://user@standby:port,primary:port/db?...`` instead of key=value.
        """
        params = {k: str(v) for k, v in parse_dsn(self.primary_dsn).items() if v}
        for name in ("host", "hostaddr", "port", "target_session_attrs"):
            params.pop(name, None)
        (standby_host, standby_port) = _endpoint(self.standby_dsn)
        (primary_host, primary_port) = _endpoint(self.primary_dsn)
        if read_write:
            params["target_session_attrs"] = "read-write"
        if not url:
            return make_dsn(
                host=f"{standby_host},{primary_host}",
                port=f"{standby_port},{primary_port}",
                **params,
            )
        user = quote(params.pop("user", ""), safe="")
        password = params.pop("password", "")
        userinfo = f"{user}:{quote(password, safe='')}@" if password else f"{user}@"
        dbname = quote(params.pop("dbname", ""), safe="")
        hosts = f"{standby_host}:{standby_port},{primary_host}:{primary_port}"
        query = f"?{urlencode(params)}" if params else ""
        return f"postgresql://{userinfo if user else ''}{hosts}/{dbname}{query}"

    def connect_primary(self, **kwargs: Any) -> psycopg.Connection[Any]:
        """A connection to the primary (autocommit unless asked otherwise)."""
        return connect_psycopg(self.primary_dsn, **{**CONNECT_OPTIONS, **kwargs})

    def connect_standby(self, **kwargs: Any) -> psycopg.Connection[Any]:
        """A connection to the standby (autocommit unless asked otherwise)."""
        return connect_psycopg(self.standby_dsn, **{**CONNECT_OPTIONS, **kwargs})

    def wait_replayed(self, timeout: float = STREAM_DEADLINE) -> None:
        """Return once the standby has replayed every WAL record the primary has written.

        A marker record is committed on the primary with ``synchronous_commit`` on, so
        that everything written before it is flushed (sequences log ahead without a
        commit of their own); then the standby's replay position must reach the
        primary's flush position.
        """
        with self.connect_primary() as primary:
            primary.execute("SET synchronous_commit TO on")
            primary.execute("SELECT pg_logical_emit_message(true, 'pgsolo-test', 'replayed?')")
            [(target,)] = primary.execute("SELECT pg_current_wal_flush_lsn()::text").fetchall()
        with self.connect_standby() as standby:
            deadline = time.monotonic() + timeout
            while True:
                row = standby.execute(
                    "SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn, pg_last_wal_replay_lsn()::text",
                    (target,),
                ).fetchone()
                if row is not None and row[0]:
                    return
                if time.monotonic() > deadline:
                    raise SetupError(
                        f"the standby replayed up to {row and row[1]}, not the primary's"
                        f" {target}, within {timeout}s"
                    )
                time.sleep(0.02)

    def check(self) -> None:
        """Fail unless the standby is in recovery, replaying this primary."""
        with self.connect_primary() as primary, self.connect_standby() as standby:
            query = "SELECT pg_is_in_recovery(), system_identifier FROM pg_control_system()"
            [primary_row] = primary.execute(query).fetchall()
            [standby_row] = standby.execute(query).fetchall()
        if primary_row[0] or not standby_row[0]:
            raise SetupError(
                f"expected a primary and a standby, got pg_is_in_recovery() = {primary_row[0]}"
                f" on the primary and {standby_row[0]} on the standby"
            )
        if primary_row[1] != standby_row[1]:
            raise SetupError("the standby is not a copy of the primary (system identifiers differ)")


def _endpoint(dsn: str) -> tuple[str, int]:
    params = parse_dsn(dsn)
    host = str(params.get("host") or params.get("hostaddr") or "")
    if not host or "," in host or host.startswith("/"):
        raise ValueError("a replica pair's servers need one TCP host each in their DSNs")
    return host, int(str(params.get("port") or "5432"))


# -- a private pair, built from the server binaries --------------------------------------


def server_binaries() -> Path:
    """The directory with initdb, pg_ctl, pg_basebackup and postgres; skips without one."""
    configured = os.environ.get(PG_BIN_ENV)
    if configured:  # CI says where they are: a wrong value must fail, not skip
        missing = [name for name in NEEDED if not os.access(Path(configured, name), os.X_OK)]
        if missing:
            raise SetupError(f"{PG_BIN_ENV}={configured!r} has no executable {', '.join(missing)}")
        return Path(configured)
    candidates = []
    for bin_dir in DEBIAN_BINARIES.glob("*/bin"):
        if all(os.access(bin_dir / name, os.X_OK) for name in NEEDED):
            version = tuple(int(part) for part in re.findall(r"\d+", bin_dir.parent.name))
            candidates.append((version, bin_dir))
    if not candidates:
        raise Unavailable(
            f"PostgreSQL server binaries not found: set {PG_BIN_ENV} to a directory with"
            f" {', '.join(NEEDED)}, or install Debian's postgresql package"
            f" ({DEBIAN_BINARIES}/*/bin)"
        )
    return max(candidates)[1]


def _server_user() -> pwd.struct_passwd | None:
    """Who runs the servers: as root, ``postgres`` (else ``nobody``); otherwise ourselves."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with suppress(KeyError):
            return pwd.getpwnam(name)
    raise SetupError("running as root, and neither a 'postgres' nor a 'nobody' user exists")


def _temp_parent(user: pwd.struct_passwd | None) -> str | None:
    """Where to put the data directories: the usual temporary directory, unless the server
    user (not us) could not reach it, say under /root; then /tmp."""
    if user is None:
        return None
    usual = Path(tempfile.gettempdir()).resolve()
    if all(p.stat().st_mode & stat.S_IXOTH for p in (usual, *usual.parents)):
        return None
    return "/tmp"  # noqa: S108 - world-traversable, and the directory is ours alone


def _dsn(port: int) -> str:
    return make_dsn(host="127.0.0.1", port=port, user="postgres", dbname="postgres")


@dataclass
class ReplicaPair(Replicas):
    """A private primary and standby that a test may stop, promote and throw away."""

    bin_dir: Path = field(default=Path())
    work_dir: Path = field(default=Path())
    user: pwd.struct_passwd | None = None

    @property
    def primary_data(self) -> Path:
        return self.work_dir / "primary"

    @property
    def standby_data(self) -> Path:
        return self.work_dir / "standby"

    def stop_primary(self, mode: str = "immediate") -> None:
        """Stop the primary; ``immediate`` is a crash: clients see their connections drop."""
        self._pg_ctl("stop", "-D", self.primary_data, "-m", mode)

    def promote(self) -> None:
        """Promote the standby and return once it accepts writes."""
        self._pg_ctl("promote", "-D", self.standby_data)

    def stop(self) -> None:
        """Stop both servers (whatever state they are in) and delete their data."""
        for data in (self.standby_data, self.primary_data):
            pid_file = data / "postmaster.pid"
            if not pid_file.exists():
                continue
            with suppress(subprocess.SubprocessError, OSError):
                self._run("pg_ctl", "stop", "-D", data, "-m", "immediate", "-w", check=False)
            with suppress(OSError, ValueError):  # pg_ctl could not: no server may outlive us
                os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        """The end of both servers' logs, for a failure message."""
        parts = []
        for name in ("primary", "standby"):
            try:
                text = (self.work_dir / f"{name}.log").read_text(errors="replace")
            except OSError as exc:
                text = f"(no log: {exc.strerror})"
            parts.append(f"--- {name}.log\n" + "\n".join(text.splitlines()[-lines:]))
        return "\n".join(parts)

    # -- building ---------------------------------------------------------------------

    def _build(self) -> None:
        self._run(
            "initdb",
            "-D",
            self.primary_data,
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "--encoding=UTF8",
            "--locale=C",
        )
        with (self.primary_data / "postgresql.conf").open("a") as conf:
            conf.write(SERVER_CONF)
        port = self._start(self.primary_data, "primary")
        self.primary_dsn = _dsn(port)
        self._run(
            "pg_basebackup",
            "--pgdata",
            self.standby_data,
            "--write-recovery-conf",
            "--wal-method=stream",
            "--checkpoint=fast",
            "--no-sync",
            "--dbname",
            self.primary_dsn,
        )
        port = self._start(self.standby_data, "standby")
        self.standby_dsn = _dsn(port)
        self._wait_streaming()

    def _start(self, data: Path, name: str) -> int:
        """Start the server in ``data`` on a free loopback port; return the port."""
        problem = ""
        for _attempt in range(STARTS):
            port = free_port()
            done = self._run(
                "pg_ctl",
                "start",
                "-D",
                data,
                "-l",
                self.work_dir / f"{name}.log",
                "-o",
                f"-c port={port}",
                "-w",
                "-t",
                str(START_DEADLINE),
                check=False,
            )
            if done.returncode == 0:
                return port
            problem = done.stdout + done.stderr
        raise SetupError(f"the {name} server did not start: {problem}\n{self.log_tail()}")

    def _wait_streaming(self) -> None:
        deadline = time.monotonic() + STREAM_DEADLINE
        streaming = "SELECT EXISTS (SELECT FROM pg_stat_replication WHERE state = 'streaming')"
        with self.connect_primary() as primary:
            while primary.execute(streaming).fetchone() != (True,):
                if time.monotonic() > deadline:
                    raise SetupError(
                        f"the standby is not streaming after {STREAM_DEADLINE}s\n" + self.log_tail()
                    )
                time.sleep(0.02)
        self.check()

    def _pg_ctl(self, action: str, *args: str | Path) -> None:
        done = self._run("pg_ctl", action, *args, "-w", "-t", str(START_DEADLINE), check=False)
        if done.returncode != 0:
            raise SetupError(
                f"pg_ctl {action} failed: {done.stdout}{done.stderr}\n{self.log_tail()}"
            )

    def _run(
        self, program: str, *args: str | Path, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        """Run one of the server programs, as the server user, from the work directory."""
        user = self.user
        # No PG* variable of ours may point the program elsewhere; HOME is where the
        # server user may look for a .pgpass (there is none).
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env.update(HOME=str(self.work_dir), LC_ALL="C")
        done = subprocess.run(  # noqa: S603 - the server's own programs, on our own directory
            [str(self.bin_dir / program), *(str(a) for a in args)],
            cwd=self.work_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=START_DEADLINE * 2,
            check=False,
            user=None if user is None else user.pw_uid,
            group=None if user is None else user.pw_gid,
            extra_groups=None if user is None else [],
        )
        if check and done.returncode != 0:
            raise SetupError(
                f"{program} failed with status {done.returncode}:\n{done.stdout}{done.stderr}"
            )
        return done


@contextmanager
def replica_pair() -> Iterator[ReplicaPair]:
    """Build a private primary + streaming standby; stop both and delete them afterwards,
    however the block ends."""
    bin_dir = server_binaries()
    user = _server_user()
    work_dir = Path(tempfile.mkdtemp(prefix="pgsolo-replicas-", dir=_temp_parent(user)))
    pair = ReplicaPair("", "", bin_dir=bin_dir, work_dir=work_dir, user=user)
    try:
        if user is not None:
            os.chown(work_dir, user.pw_uid, user.pw_gid)
        pair._build()
        yield pair
    finally:
        pair.stop()
