"""A loopback TCP relay in front of the test server: to the server, a client behind it
looks like a client behind a proxy or a NAT (another address and port), and it can stop
passing the server's replies on (a half-open connection, a frozen server)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from contextlib import suppress

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

# The server's ReadyForQuery message, idle ('I'): what ends a successful login.
READY_AFTER_LOGIN = b"Z\x00\x00\x00\x05I"


class FreezingProxy:
    """A loopback TCP proxy to the test server that can stop passing the server's replies on.

    Every connection accepted on 127.0.0.1 is forwarded, both ways, to the server (its unix
    socket ``<dir>/.s.PGSQL.<port>`` or its TCP address). After :meth:`freeze`, what the
    server sends on the connections open at that moment is dropped: to the client they
    look half-open, or like a frozen server, while the proxy's kernel still acknowledges
    everything it sends. Connections opened later work normally. When a client closes or
    shuts down its side, the proxy closes the server side too, as a server's TCP stack
    would eventually notice.

    With ``freeze_after_login``, every connection freezes by itself as soon as the server
    says it is ready for the first query: the client connects and logs in, and then no
    answer ever comes (a server that stops answering right after a connection opened).
    """

    def __init__(self, dsn: str, *, freeze_after_login: bool = False) -> None:
        params = conninfo_to_dict(dsn)
        host, port = str(params.get("host") or ""), str(params.get("port") or "5432")
        if not host or "," in host:
            pytest.skip("the proxy needs a DSN with exactly one host or socket directory")
        self.upstream: str | tuple[str, int] = (
            f"{host}/.s.PGSQL.{port}"
            if host.startswith("/")
            else (str(params.get("hostaddr") or host), int(port))
        )
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.port = int(self.listener.getsockname()[1])
        via = {k: v for k, v in params.items() if k != "hostaddr"}
        self.dsn = make_conninfo("", **{**via, "host": "127.0.0.1", "port": str(self.port)})
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._frozen: list[threading.Event] = []
        self._threads: list[threading.Thread] = []
        self._closing = threading.Event()
        self._freeze_after_login = freeze_after_login
        self._spawn(self._accept)

    def __enter__(self) -> FreezingProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self._closing.set()
        with self._lock:
            for sock in self._sockets:
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        for thread in self._threads:
            thread.join(timeout=10)
        with self._lock:
            for sock in self._sockets:
                sock.close()
        self.listener.close()

    def freeze(self) -> None:
        with self._lock:
            for frozen in self._frozen:
                frozen.set()

    @property
    def frozen_connections(self) -> int:
        """How many of the connections so far are frozen (with ``freeze_after_login``:
        how many logged in before their answers stopped)."""
        with self._lock:
            return sum(frozen.is_set() for frozen in self._frozen)

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            client.settimeout(None)
            if isinstance(self.upstream, str):
                server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                server.settimeout(10)
                server.connect(self.upstream)
            else:
                server = socket.create_connection(self.upstream, timeout=10)
            server.settimeout(None)
            frozen = threading.Event()
            with self._lock:
                self._sockets += [client, server]
                self._frozen.append(frozen)
                self._spawn(self._pump, client, server, None)
                self._spawn(self._pump, server, client, frozen, self._freeze_after_login)

    @staticmethod
    def _pump(
        source: socket.socket,
        sink: socket.socket,
        frozen: threading.Event | None,
        freeze_after_login: bool = False,
    ) -> None:
        seen = b""  # the end of what came before, for a message split between reads
        try:
            while data := source.recv(65536):
                if freeze_after_login and frozen is not None and not frozen.is_set():
                    window = seen + data
                    at = window.find(READY_AFTER_LOGIN)
                    if at >= 0:  # pass the login on, up to its ReadyForQuery; then nothing
                        # Frozen before the client can see its login end, so that a test
                        # reading frozen_connections once connected finds it counted.
                        frozen.set()
                        sink.sendall(data[: at + len(READY_AFTER_LOGIN) - len(seen)])
                        continue
                    seen = window[-(len(READY_AFTER_LOGIN) - 1) :]
                if frozen is None or not frozen.is_set():
                    sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):  # one side is gone: so is the other
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
