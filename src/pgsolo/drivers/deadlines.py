"""Hard deadlines on round trips, for connections pgsolo opened itself.

A server that accepts connections but never answers (a stopped process, a half-open TCP
connection, a black-holed address) would hold a blocked read forever. A driver arms a
deadline around each of pgsolo's round trips; when one expires, the connection's socket is
shut down (:func:`shut_down_socket`), so the blocked read fails at once and the driver can
say why. One thread serves every deadline of the process: arming and disarming cost a heap
push and a dict operation, not a thread per round trip. Driver-independent: it only ever
sees a callable to run.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable

from .._logging import drivers_logger as logger

__all__ = ["DEADLINES", "Deadlines", "host_port", "shut_down_socket", "socket_address"]


class Deadlines:
    """One thread for every armed deadline: arming and disarming cost a heap push and
    a dict operation, not a thread per round trip."""

    def __init__(self) -> None:
        # A plain lock, taken by arm() and disarm() on every round trip: entered in C,
        # where a Condition's own lock (an RLock by default) is entered through two Python
        # calls. The timer thread sleeps on a condition over the same lock.
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._heap: list[tuple[float, int]] = []
        self._actions: dict[int, Callable[[], None]] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None

    def arm(self, seconds: float, action: Callable[[], None]) -> int:
        due = time.monotonic() + seconds
        with self._mutex:
            ident = next(self._ids)
            self._actions[ident] = action
            if len(self._heap) > 2 * len(self._actions) + 1000:  # mostly disarmed ones
                self._heap = [entry for entry in self._heap if entry[1] in self._actions]
                heapq.heapify(self._heap)
            # The thread sleeps until the earliest deadline: wake it only for an earlier one.
            earlier = not self._heap or due < self._heap[0][0]
            heapq.heappush(self._heap, (due, ident))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="pgsolo-deadlines", daemon=True
                )
                self._thread.start()
            elif earlier:
                self._cond.notify()
            return ident

    def disarm(self, ident: int) -> bool:
        """Whether the action ran: after this returns it has, or it never will."""
        with self._mutex:
            return self._actions.pop(ident, None) is None

    def _run(self) -> None:
        with self._cond:
            while True:
                while self._heap and self._heap[0][1] not in self._actions:
                    heapq.heappop(self._heap)  # disarmed
                if not self._heap:
                    self._cond.wait()
                    continue
                due, ident = self._heap[0]
                remaining = due - time.monotonic()
                if remaining > 0:
                    self._cond.wait(remaining)
                    continue
                heapq.heappop(self._heap)
                action = self._actions.pop(ident)
                try:  # under the lock: disarm() cannot return while it runs
                    action()
                except Exception:  # pragma: no cover - shutting a socket down
                    logger.exception("pgsolo: a connection deadline failed")


DEADLINES = Deadlines()
"""The one timer thread of the process."""


def shut_down_socket(fileno: int) -> None:
    """``shutdown(SHUT_RDWR)`` on socket ``fileno`` from any thread: whoever waits on it sees
    the end of the stream at once. Through a duplicate of the descriptor, so its owner still
    owns (and closes) the original."""
    # Through a duplicate of the descriptor, so the driver still owns (and closes) its own.
    try:
        copy = os.dup(fileno)
    except OSError:
        return
    try:
        sock = socket.socket(fileno=copy)
    except OSError:
        os.close(copy)
        return
    with sock, contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


def socket_address(fileno: int) -> tuple[str, int] | None:
    """(address, port) of this end of TCP socket ``fileno`` (through a duplicate of the
    descriptor, which its owner keeps); None for a unix socket or a closed one."""
    with contextlib.suppress(OSError), socket.socket(fileno=os.dup(fileno)) as sock:
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            address = sock.getsockname()
            return str(address[0]), int(address[1])
    return None


def host_port(address: object) -> tuple[str, int | None]:
    """(host, port) of a connection's peer address: a TCP (host, port, ...), or a unix
    socket's path (its directory, and the port in its name, ``.s.PGSQL.5432``)."""
    if isinstance(address, tuple):
        return str(address[0]), int(address[1])
    path = str(address)
    directory, _, name = path.rpartition("/")
    port = name.rpartition(".")[2]
    return (directory or path), (int(port) if port.isdigit() else None)
