"""Is a session lock safe on this connection? Telling a direct connection from a proxy,
and a session-pinning proxy from a transaction-pooling one, by what the server says.

A transaction-pooling proxy (PgBouncer ``pool_mode=transaction``) gives each transaction
of a client to whichever server connection is free. A session lock then stays on a
backend the client no longer talks to: the client cannot release it, may not notice it is
gone, and another client landing on that backend "holds" it too.

The check, once per connection (its result is kept with the connection's holdings):

1. Stamp the session with a random token and ask who answers: the backend pid, the
   client address and port the server sees, and whether the server is in recovery (a
   hot standby grants advisory locks that no other server sees: refused at once). A
   direct connection is one where the server sees this client's own socket (same
   address and port; for a unix socket, none) and the pid is the one the connection
   announced when it opened (a proxy announces its own). Then there is nothing in
   between, and nothing more to check.
2. Otherwise something sits in between: a session-pinning proxy, a NAT, or a
   transaction pooler. Open a second connection to the same place and see whether it
   lands on the stamped session (an idle transaction pooler hands the same backend to the
   next client), then ask again on this connection whether it still reaches the stamped
   session (a busy transaction pooler moves it). Either one means transaction pooling.
   Repeated a few times; each round costs two round trips and the second connection.

A pooler can still move a client later, so every acquire and unlock pgsolo sends for a
session lock behind a proxy runs only on the backend the check found (its pid names one
live session), and the keeper checks the answering backend with every beat.
"""

from __future__ import annotations

import ipaddress
import secrets
from dataclasses import dataclass, field

from .. import sql
from ..drivers import DriverBase, TxStatus
from ..errors import DatabaseUnavailableError, PgsoloError, UnsafeConnectionError
from .placement import outside_transaction
from .plans import Elsewhere, Plan

__all__ = [
    "PROBE_ROUNDS",
    "Route",
    "check_route",
    "in_recovery_error",
    "transaction_pooling_error",
]

PROBE_ROUNDS = 3


@dataclass(frozen=True, slots=True)
class Route:
    """What answers this connection: the server backend's pid, the token stamped on its
    session, and whether the connection goes straight to it."""

    server_pid: int
    token: str
    direct: bool
    # The backend a statement must run on to act on this session (behind a proxy), or
    # None (a direct connection: it always does). Set once: a lock reads it at each step.
    guard: int | None = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "guard", None if self.direct else self.server_pid)


def check_route(driver: DriverBase, status: TxStatus) -> Plan[Route]:
    """Stamp the session and find out whether a session lock is safe on it; raise
    :class:`UnsafeConnectionError` when it is not."""
    token = secrets.token_hex(16)
    # Outside a transaction the driver may open, so that the setting outlives it.
    answer = yield outside_transaction(driver, [sql.stamp_session(token)])
    pid_text, address, port_text, in_recovery, _ = str(sql.read_text(answer)).split(" ", 4)
    if in_recovery == "t":
        raise in_recovery_error(driver.server_info().address)
    route = Route(int(pid_text), token, _direct(driver, int(pid_text), address, int(port_text)))
    if route.direct:
        return route
    if status is not TxStatus.IDLE:
        raise UnsafeConnectionError(
            "pgsolo cannot tell whether this connection is safe for a session lock: it goes"
            " through a proxy (the server sees another client address or backend), and"
            " that can only be checked between transactions. Take the first session lock"
            " on this connection outside a transaction, or use xact_lock().",
            reason="proxy-unchecked",
        )
    for _ in range(PROBE_ROUNDS):
        if (yield from _landed_on(driver, token)) is True:
            raise transaction_pooling_error(
                "a second connection to the same place landed on the same server session"
            )
        recheck = outside_transaction(driver, [sql.still_on_session(token, route.server_pid)])
        if (yield recheck) is not True:
            raise transaction_pooling_error(
                "this connection's statements moved to another server session"
            )
    return route


def _landed_on(driver: DriverBase, token: str) -> Plan[object]:
    """Whether a second connection to the same place lands on the session stamped
    ``token``. That connection is pgsolo's own: one that cannot be opened (the server
    restarting, refusing one more connection) is a
    :class:`~pgsolo.DatabaseUnavailableError`, with the driver's error as its cause, while
    the caller's connection may live on."""
    try:
        return (yield Elsewhere([sql.is_session(token)]))
    except Exception as exc:
        if isinstance(exc, PgsoloError):  # a deadline's, which says so already
            raise
        said = driver.scrub(" ".join(str(exc).split()) or type(exc).__name__)
        raise DatabaseUnavailableError(
            "pgsolo could not check what answers this connection (it goes through a"
            f" proxy): a second connection to {driver.server_info().address} failed"
            f" ({said}); nothing is held"
        ) from exc


def _direct(driver: DriverBase, server_pid: int, address: str, port: int) -> bool:
    if server_pid != driver.backend_pid():
        return False  # the pid announced at connection time was a proxy's
    mine = driver.client_address()
    if mine is None:
        return address == "-"  # a unix socket on both ends
    if address == "-":
        return False
    return port == mine[1] and _same_address(address, mine[0])


def _same_address(a: str, b: str) -> bool:
    try:
        first, second = ipaddress.ip_address(a), ipaddress.ip_address(b)
    except ValueError:
        return a == b
    return _unmapped(first) == _unmapped(second)


def _unmapped(
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address,
) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """``::ffff:127.0.0.1`` is ``127.0.0.1`` seen through an IPv6 socket."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def transaction_pooling_error(evidence: str) -> UnsafeConnectionError:
    return UnsafeConnectionError(
        "session locks are not safe on this connection: it goes through a"
        " transaction-pooling proxy (such as PgBouncer with pool_mode=transaction), which"
        " hands the server session to other clients between transactions, so the lock would"
        f" stay behind on a backend this client no longer talks to ({evidence}). Use"
        " xact_lock() (transaction-level locks work through such a proxy), or take session"
        " locks on a connection pinned to one server session: direct to PostgreSQL or"
        " through a session-pooling proxy (PgBouncer pool_mode=session).",
        reason="transaction-pooling",
    )


def in_recovery_error(address: str) -> UnsafeConnectionError:
    return UnsafeConnectionError(
        f"advisory locks are not safe on this connection: the server at {address} is in"
        " recovery (a hot standby), which grants advisory locks locally, unseen by the"
        " primary and by every other standby, so the work would run everywhere at once."
        " Connect to the primary: its own address, or a multi-host connection string with"
        " target_session_attrs=read-write (libpq then skips standbys). Nothing was taken.",
        reason="server-in-recovery",
    )
