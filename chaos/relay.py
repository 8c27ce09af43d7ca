"""A loopback TCP relay in front of the server that can blackhole or reset its connections.

Unlike the tests' ``FreezingProxy`` (``tests/_relay.py``), which drops what the server
says for good, this relay *holds* traffic during a blackhole and passes it on after
(what a network partition that heals looks like to both ends: nothing arrives for a few
seconds, then everything does, and the protocol stream stays intact). A reset ends every
open connection with a TCP RST on the client's side and an end of stream on the
server's, so the server ends those sessions and their advisory locks with them.
"""

from __future__ import annotations

import functools
import socket
import struct
import threading
from contextlib import suppress

from psycopg.conninfo import conninfo_to_dict, make_conninfo


class Relay:
    def __init__(self, dsn: str) -> None:
        params = conninfo_to_dict(dsn)
        host, port = str(params.get("host") or ""), str(params.get("port") or "5432")
        if not host or "," in host:
            raise ValueError("the relay needs a DSN with exactly one host or socket directory")
        self.upstream: str | tuple[str, int] = (
            f"{host}/.s.PGSQL.{port}"
            if host.startswith("/")
            else (str(params.get("hostaddr") or host), int(port))
        )
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        via = {k: v for k, v in params.items() if k != "hostaddr"}
        port_here = str(self.listener.getsockname()[1])
        self.dsn = make_conninfo("", **{**via, "host": "127.0.0.1", "port": port_here})
        self._flowing = threading.Event()
        self._flowing.set()
        self._closing = threading.Event()
        self._lock = threading.Lock()
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept)

    def blackhole(self, seconds: float) -> None:
        """Pass nothing on, either way, for ``seconds``; then everything that waited."""
        self._flowing.clear()
        try:
            self._closing.wait(seconds)
        finally:
            self._flowing.set()

    def reset(self) -> int:
        """Reset every open connection; return how many there were."""
        with self._lock:
            pairs = list(self._pairs)
        for client, server in pairs:
            with suppress(OSError):  # linger 0: close sends RST instead of FIN
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            for sock in (client, server):
                with suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
        return len(pairs)

    def close(self) -> None:
        self._closing.set()
        self._flowing.set()
        self.reset()
        for thread in list(self._threads):
            thread.join(timeout=10)
        self.listener.close()

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
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
            pair = (client, server)
            with self._lock:
                self._pairs.add(pair)
            ends = threading.Barrier(2, action=functools.partial(self._closed, pair))
            self._spawn(self._pump, client, server, ends)
            self._spawn(self._pump, server, client, ends)

    def _closed(self, pair: tuple[socket.socket, socket.socket]) -> None:
        with self._lock:
            self._pairs.discard(pair)
        for sock in pair:
            sock.close()

    def _pump(self, source: socket.socket, sink: socket.socket, ends: threading.Barrier) -> None:
        try:
            while data := source.recv(65536):
                self._flowing.wait()
                sink.sendall(data)
        except OSError:
            pass
        for sock in (source, sink):  # one side is gone: so is the other
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        with suppress(threading.BrokenBarrierError):
            ends.wait(30)
