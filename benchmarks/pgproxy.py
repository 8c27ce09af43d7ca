"""A loopback TCP proxy for PostgreSQL that delays server replies and counts round trips.

It runs an asyncio loop in a daemon thread of the benchmark's own process, listens on
127.0.0.1 only, and forwards every connection to one upstream server: a TCP address, or
the server's unix socket (``<dir>/.s.PGSQL.<port>``). Client data is forwarded at once;
every chunk the server sends back is held for ``delay_ms`` before it reaches the client,
so each round trip costs at least that much, as it would over a real network.

Round trips are counted, not guessed: the client->server stream is parsed into protocol
messages, and a new *turn* starts when the client sends after the server has spoken on
that connection. A turn whose only message is Terminate is not a round trip (nobody
waits for an answer). Each turn is attributed to the label the benchmark set when it
started, so sequential operations can be told apart, and can be recorded with the SQL
each message carried (``Query`` text, ``Parse`` text, ``Bind`` resolved to its
statement) to show which statements travelled together.

The proxy stops itself after ``max_seconds`` whatever happens, and at ``stop()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from collections import Counter
from dataclasses import dataclass, field

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
CANCEL_REQUEST = 80877102
_CHUNK = 65536
_TIMER_SLACK = 0.0015  # seconds before a delivery is due when the coarse sleep ends


def _cstring(body: bytes, start: int) -> tuple[str, int]:
    end = body.find(b"\0", start)
    if end < 0:
        return body[start:].decode("utf-8", "replace"), len(body)
    return body[start:end].decode("utf-8", "replace"), end + 1


def _short(sql: str, limit: int = 90) -> str:
    sql = " ".join(sql.split())
    return sql if len(sql) <= limit else sql[: limit - 3] + "..."


class ClientStream:
    """Splits the frontend (client->server) byte stream into readable message labels."""

    def __init__(self) -> None:
        self._buf = bytearray()
        self._startup = True
        self.awaiting_encryption_answer = False
        self.opaque = False  # the session switched to TLS/GSS: bytes cannot be read
        self._statements: dict[str, str] = {}

    def feed(self, data: bytes) -> list[str]:
        if self.opaque:
            return ["<encrypted>"]
        self._buf += data
        out: list[str] = []
        while True:
            if self._startup:
                if len(self._buf) < 8:
                    break
                length = int.from_bytes(self._buf[0:4], "big")
                if len(self._buf) < length:
                    break
                code = int.from_bytes(self._buf[4:8], "big")
                del self._buf[:length]
                if code == SSL_REQUEST:
                    out.append("SSLRequest")
                    self.awaiting_encryption_answer = True
                elif code == GSSENC_REQUEST:
                    out.append("GSSENCRequest")
                    self.awaiting_encryption_answer = True
                elif code == CANCEL_REQUEST:
                    out.append("CancelRequest")
                else:
                    out.append("Startup")
                    self._startup = False
                continue
            if len(self._buf) < 5:
                break
            kind = chr(self._buf[0])
            length = int.from_bytes(self._buf[1:5], "big")
            if len(self._buf) < 1 + length:
                break
            body = bytes(self._buf[5 : 1 + length])
            del self._buf[: 1 + length]
            out.append(self._describe(kind, body))
        return out

    def server_answered_encryption(self, first_byte: int) -> None:
        self.awaiting_encryption_answer = False
        if first_byte in (ord("S"), ord("G")):
            self.opaque = True

    def _describe(self, kind: str, body: bytes) -> str:
        if kind == "Q":
            text, _ = _cstring(body, 0)
            return f'Query "{_short(text)}"'
        if kind == "P":
            name, pos = _cstring(body, 0)
            text, _ = _cstring(body, pos)
            self._statements[name] = text
            return f'Parse "{_short(text)}"'
        if kind == "B":
            _portal, pos = _cstring(body, 0)
            name, _ = _cstring(body, pos)
            known = self._statements.get(name)
            return f'Bind "{_short(known)}"' if known is not None else f"Bind {name!r}"
        return {
            "E": "Execute",
            "D": "Describe",
            "S": "Sync",
            "H": "Flush",
            "X": "Terminate",
            "C": "Close",
            "p": "Password",
            "F": "FunctionCall",
            "d": "CopyData",
            "c": "CopyDone",
            "f": "CopyFail",
        }.get(kind, f"Message {kind!r}")


def compact(messages: list[str]) -> str:
    """One turn as text: a Bind of the statement just parsed is not repeated."""
    parts: list[str] = []
    last_parsed: str | None = None
    for message in messages:
        shown = message
        if message.startswith("Parse "):
            last_parsed = message.removeprefix("Parse ")
        elif message.startswith("Bind ") and message.removeprefix("Bind ") == last_parsed:
            shown = "Bind"
        parts.append(shown)
    return " + ".join(parts)


@dataclass
class Turn:
    label: str | None
    connection: int
    index: int  # the turn's number on its connection, from 1
    messages: list[str] = field(default_factory=list)

    @property
    def is_round_trip(self) -> bool:
        return any(m != "Terminate" for m in self.messages)


@dataclass
class _Conn:
    ident: int
    stream: ClientStream = field(default_factory=ClientStream)
    server_spoke: bool = True  # so the first client bytes start a turn
    turns: int = 0
    turn: Turn | None = None
    counted: bool = False


class LatencyProxy:
    """See the module docstring. Use as a context manager, or start()/stop()."""

    def __init__(
        self, upstream: str | tuple[str, int], delay_ms: float, *, max_seconds: float = 900.0
    ) -> None:
        if delay_ms < 0:
            raise ValueError("delay_ms must not be negative")
        self.upstream = upstream
        self.delay = delay_ms / 1000
        self.max_seconds = max_seconds
        self.label: str | None = None  # set by the benchmark thread between operations
        self.port = 0
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._round_trips: Counter[str] = Counter()
        self._connections: Counter[str] = Counter()
        self._trace: list[Turn] | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None

    # -- the benchmark's side --------------------------------------------------------

    def start(self) -> tuple[str, int]:
        self._thread = threading.Thread(target=self._run, name="pg-latency-proxy", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout=10) or self._error is not None:
            raise RuntimeError(f"the latency proxy did not start: {self._error!r}")
        return "127.0.0.1", self.port

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already ended by itself
                self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> LatencyProxy:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def round_trips(self, label: str) -> int:
        with self._lock:
            return self._round_trips[label]

    def connections(self, label: str) -> int:
        with self._lock:
            return self._connections[label]

    def start_trace(self) -> None:
        with self._lock:
            self._trace = []

    def stop_trace(self) -> list[Turn]:
        with self._lock:
            turns, self._trace = self._trace or [], None
        return turns

    # -- the proxy thread ------------------------------------------------------------

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as exc:  # reported to start(); the thread must not die loudly
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        tasks: set[asyncio.Task[None]] = set()

        def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.create_task(self._serve(reader, writer))
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        server = await asyncio.start_server(on_client, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), timeout=self.max_seconds)
        finally:
            server.close()
            for task in list(tasks):
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _open_upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if isinstance(self.upstream, str):
            return await asyncio.open_unix_connection(self.upstream)
        host, port = self.upstream
        return await asyncio.open_connection(host, port)

    async def _serve(self, c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        conn = _Conn(next(self._ids))
        with self._lock:
            if self.label is not None:
                self._connections[self.label] += 1
        try:
            s_reader, s_writer = await self._open_upstream()
        except OSError:
            c_writer.close()
            return
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()
        pumps = [
            asyncio.create_task(self._client_to_server(conn, c_reader, s_writer)),
            asyncio.create_task(self._server_to_queue(conn, s_reader, queue)),
            asyncio.create_task(self._queue_to_client(conn, queue, c_writer)),
        ]
        try:
            # The connection is over when the server side is done and delivered, or
            # the client went away.
            await asyncio.wait([pumps[0], pumps[2]], return_when=asyncio.FIRST_COMPLETED)
            if pumps[0].done():
                with contextlib.suppress(asyncio.TimeoutError, Exception):
                    await asyncio.wait_for(asyncio.shield(pumps[2]), timeout=self.delay + 1)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for writer in (s_writer, c_writer):
                writer.close()
                with contextlib.suppress(Exception):
                    await writer.wait_closed()

    async def _client_to_server(
        self, conn: _Conn, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        while data := await reader.read(_CHUNK):
            self._account(conn, data)
            writer.write(data)
            await writer.drain()
        with contextlib.suppress(OSError):
            writer.write_eof()

    async def _server_to_queue(
        self,
        conn: _Conn,
        reader: asyncio.StreamReader,
        queue: asyncio.Queue[tuple[float, bytes] | None],
    ) -> None:
        loop = asyncio.get_running_loop()
        try:
            while data := await reader.read(_CHUNK):
                if conn.stream.awaiting_encryption_answer:
                    conn.stream.server_answered_encryption(data[0])
                queue.put_nowait((loop.time() + self.delay, data))
        finally:
            queue.put_nowait(None)

    async def _queue_to_client(
        self,
        conn: _Conn,
        queue: asyncio.Queue[tuple[float, bytes] | None],
        writer: asyncio.StreamWriter,
    ) -> None:
        loop = asyncio.get_running_loop()
        while (item := await queue.get()) is not None:
            due, data = item
            # The loop's timers wake up to ~1 ms late (epoll rounds its timeout up to
            # whole ms): sleep coarsely, then yield to the loop until the chunk is due.
            if (wait := due - loop.time() - _TIMER_SLACK) > 0:
                await asyncio.sleep(wait)
            while loop.time() < due:  # noqa: ASYNC110 - a timed spin, no event to wait for
                await asyncio.sleep(0)
            writer.write(data)
            await writer.drain()
            conn.server_spoke = True

    def _account(self, conn: _Conn, data: bytes) -> None:
        messages = conn.stream.feed(data)
        with self._lock:
            if conn.server_spoke or conn.turn is None:
                conn.server_spoke = False
                conn.turns += 1
                conn.turn = Turn(self.label, conn.ident, conn.turns)
                conn.counted = False
                if self._trace is not None:
                    self._trace.append(conn.turn)
            turn = conn.turn
            turn.messages.extend(messages)
            if not conn.counted and turn.is_round_trip and turn.label is not None:
                conn.counted = True
                self._round_trips[turn.label] += 1
