"""A loopback TCP relay in front of a server: the network between a client and PostgreSQL,
in a test's hands.

To the server, a client behind the relay looks like a client behind a proxy or a NAT
(another address and port). The relay can then cut that network four ways:

- :meth:`Relay.blackhole` / :meth:`Relay.blackholed`: nothing passes, either way, for a
  while; what waited passes on after (a network partition that heals: nothing arrives for a
  few seconds, then everything does, and the protocol stream stays intact).
- :meth:`Relay.freeze`: what the server says on the connections open now is dropped for
  good, while the relay's kernel still acknowledges what the client sends (a half-open
  connection, or a frozen server). Connections opened later work normally. With
  ``freeze_after_login``, every connection freezes by itself once its login is done.
- :meth:`Relay.reset`: every open connection ends, with a TCP RST on the client's side and
  an end of stream on the server's, so the server ends those sessions and their advisory
  locks with them.
- :meth:`Relay.cut`: a network cut, once the server has given the client up: the server's
  side of every open connection ends (the server ends those sessions, and their locks),
  while the client hears nothing more, ever, and is never told: what it sends is dropped,
  its connection stays open and silent until the client or the relay closes it.

And it can move a connection to another session, as a transaction-pooling proxy does
between transactions: :meth:`Relay.swap` exchanges the server sessions of two idle
connections, unknown to both clients.
"""

from __future__ import annotations

import functools
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field

from ..drivers.conninfo import make_dsn, parse_dsn

__all__ = ["Relay"]

# The server's ReadyForQuery message, idle ('I'): what ends a successful login.
READY_AFTER_LOGIN = b"Z\x00\x00\x00\x05I"


@dataclass(eq=False)
class _Link:
    """One client's connection through the relay: both sockets, and whether the server's
    side of it is frozen."""

    client: socket.socket
    server: socket.socket  # exchanged with another link's by Relay.swap
    frozen: threading.Event = field(default_factory=threading.Event)
    cut: threading.Event = field(default_factory=threading.Event)


class Relay:
    """A TCP relay on 127.0.0.1 to the server of ``dsn`` (its TCP address or its unix
    socket); :attr:`dsn` is ``dsn`` through the relay. Close it (or use it as a context
    manager) to end every connection through it."""

    def __init__(self, dsn: str, *, freeze_after_login: bool = False) -> None:
        params = parse_dsn(dsn)
        host, port = str(params.get("host") or ""), str(params.get("port") or "5432")
        if not host or "," in host:
            raise ValueError("the relay needs a DSN with exactly one host or socket directory")
        self.upstream: str | tuple[str, int] = (
            f"{host}/.s.PGSQL.{port}"
            if host.startswith("/")
            else (str(params.get("hostaddr") or host), int(port))
        )
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.port = int(self.listener.getsockname()[1])
        via = {k: v for k, v in params.items() if k != "hostaddr"}
        self.dsn = make_dsn(**{**via, "host": "127.0.0.1", "port": str(self.port)})
        self._freeze_after_login = freeze_after_login
        self._flowing = threading.Event()
        self._flowing.set()
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._links: set[_Link] = set()
        self._link_of: dict[socket.socket, _Link] = {}  # by server socket (swap moves them)
        self._frozen: list[threading.Event] = []  # every link's, closed or not
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept)

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def blackholed(self) -> Iterator[None]:
        """Inside the block nothing passes, either way, on any connection (new ones
        included: their login waits); what waited passes on after."""
        self._flowing.clear()
        try:
            yield
        finally:
            self._flowing.set()

    def blackhole(self, seconds: float) -> None:
        """:meth:`blackholed` for ``seconds`` (returns after them)."""
        with self.blackholed():
            self._closing.wait(seconds)

    def freeze(self) -> None:
        """Drop, for good, what the server says on the connections open now."""
        with self._lock:
            for link in self._links:
                link.frozen.set()

    @property
    def frozen_connections(self) -> int:
        """How many of the connections so far are frozen (with ``freeze_after_login``:
        how many logged in before their answers stopped)."""
        with self._lock:
            return sum(frozen.is_set() for frozen in self._frozen)

    def reset(self) -> int:
        """Reset every open connection; return how many there were."""
        with self._lock:
            links = list(self._links)
        for link in links:
            with suppress(OSError):  # linger 0: close sends RST instead of FIN
                link.client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            for sock in (link.client, link.server):
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        return len(links)

    def cut(self) -> int:
        """Cut every open connection (see the module); return how many there were. The
        server's detection of a real cut (its TCP keepalives) is not in it: the cut is
        the moment that detection ends."""
        with self._lock:
            links = list(self._links)
        for link in links:
            link.cut.set()
            with suppress(OSError):
                link.server.shutdown(socket.SHUT_RDWR)
        return len(links)

    def swap(self, first_port: int, second_port: int) -> None:
        """Exchange the server sessions of two connections through the relay, named by
        their clients' local ports: from now on what each client sends runs on the
        other's session, and each hears that session's answers, as when a
        transaction-pooling proxy hands a client another server connection between two
        transactions. Both connections must be idle, with nothing in flight: a message
        on its way while they are exchanged may reach either."""
        with self._lock:
            by_port: dict[int, _Link] = {}
            for link in self._links:
                with suppress(OSError):  # a client that just left
                    by_port[link.client.getpeername()[1]] = link
            for port in (first_port, second_port):
                if port not in by_port:
                    raise ValueError(f"no connection from port {port} is open through the relay")
            first, second = by_port[first_port], by_port[second_port]
            first.server, second.server = second.server, first.server
            self._link_of[first.server], self._link_of[second.server] = first, second

    def close(self) -> None:
        """End every connection through the relay, and the relay."""
        self._closing.set()
        self._flowing.set()
        self.reset()
        for thread in list(self._threads):
            thread.join(timeout=10)
        self.listener.close()

    def _spawn(self, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                if isinstance(self.upstream, str):
                    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                    server.settimeout(10)
                    server.connect(self.upstream)
                else:
                    server = socket.create_connection(self.upstream, timeout=10)
            except OSError:  # the server is restarting: the client sees its connection end
                client.close()
                continue
            client.settimeout(None)
            server.settimeout(None)
            link = _Link(client, server)
            with self._lock:
                self._links.add(link)
                self._link_of[server] = link
                self._frozen.append(link.frozen)
            ends = threading.Barrier(2, action=functools.partial(self._closed, link))
            self._spawn(self._pump, link, client, ends, None)
            self._spawn(self._pump, link, server, ends, link.frozen)

    def _closed(self, link: _Link) -> None:
        with self._lock:
            self._links.discard(link)
            self._link_of.pop(link.server, None)
        link.client.close()
        link.server.close()

    def _sink(self, link: _Link, source: socket.socket) -> socket.socket:
        """Where what ``source`` says goes now: a client's to its link's server, a
        server's to the client of the link it belongs to (swap() moves them)."""
        if source is link.client:
            return link.server
        with self._lock:
            return self._link_of.get(source, link).client

    def _pump(
        self,
        link: _Link,
        source: socket.socket,
        ends: threading.Barrier,
        frozen: threading.Event | None,  # the server's side only: what a freeze drops
    ) -> None:
        seen = b""  # the end of what came before, for a message split between reads
        try:
            while data := source.recv(65536):
                self._flowing.wait()
                if link.cut.is_set():
                    continue  # a cut network: nothing passes, and nobody is told
                if frozen is not None and self._freeze_after_login and not frozen.is_set():
                    window = seen + data
                    at = window.find(READY_AFTER_LOGIN)
                    if at >= 0:  # pass the login on, up to its ReadyForQuery; then nothing
                        # Frozen before the client can see its login end, so that a test
                        # reading frozen_connections once connected finds it counted.
                        frozen.set()
                        sink = self._sink(link, source)
                        sink.sendall(data[: at + len(READY_AFTER_LOGIN) - len(seen)])
                        continue
                    seen = window[-(len(READY_AFTER_LOGIN) - 1) :]
                if frozen is None or not frozen.is_set():
                    self._sink(link, source).sendall(data)
        except OSError:
            pass
        cut = link.cut.is_set()
        # One side is gone: so is the other, unless cut off.
        for sock in (source, self._sink(link, source)):
            if not (cut and sock is link.client and source is not link.client):
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        with suppress(threading.BrokenBarrierError):
            # A cut client's side lives until the client or the relay closes it.
            ends.wait(None if cut else 30)
