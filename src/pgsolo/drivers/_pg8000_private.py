"""The one place pgsolo reads pg8000's private attributes: what the server told the
connection without a round trip (its ReadyForQuery transaction status and its
BackendKeyData, the backend's pid) and the connection's socket, for which pg8000 has no
public API. Checked on pg8000 1.31, the range pyproject.toml allows; ``nox -s lowest``
runs the driver tests on the lowest, CI's suite on the newest.
"""

from __future__ import annotations

import socket
from typing import Any

__all__ = ["backend_key_data", "sock", "transaction_status"]


def transaction_status(conn: Any) -> bytes | None:
    """The status byte of the server's last ReadyForQuery (None before the first)."""
    status: bytes | None = conn._transaction_status
    return status


def backend_key_data(conn: Any) -> bytes | None:
    """The BackendKeyData message's body: the backend's pid, then its secret key."""
    data: bytes | None = conn._backend_key_data
    return data


def sock(conn: Any) -> socket.socket | None:
    """The connection's socket (None once pg8000 closed it)."""
    usock: socket.socket | None = conn._usock
    return usock
