"""The signals that would end ``pgsolo run`` by default (SIGTERM, SIGINT, SIGHUP, SIGQUIT,
SIGUSR1, SIGUSR2), for the whole of one run: forwarded to COMMAND while it runs, ending a
wait before it starts. Left to their default action, they killed pgsolo at once: the key
was let go while what COMMAND started ran on, and no outcome was written."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, Protocol

__all__ = ["FORWARDED_SIGNALS", "TERMINAL_SIGNALS", "Interrupted", "RunSignals", "signal_name"]


FORWARDED_SIGNALS = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,  # a terminal or an ssh session that closed
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
)
# What a terminal sends its foreground process group itself (Ctrl-C, Ctrl-\).
TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGQUIT)


class Forwarding(Protocol):
    """What a signal is passed on to: COMMAND and what it started (``child.Child``)."""

    def forward(self, signum: int) -> None: ...


class Interrupted(KeyboardInterrupt):
    """One of FORWARDED_SIGNALS before COMMAND started.

    :class:`RunSignals` raises it from its handler to end a wait; being a
    ``KeyboardInterrupt``, psycopg cancels the statement in flight before passing it on.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(f"pgsolo got {signal_name(signum)} before the command started")
        self.signum = signum


class RunSignals:
    """FORWARDED_SIGNALS for the whole of one ``pgsolo run`` (main thread only).

    Installed (:meth:`installed`) before anything connects, so that no signal kills pgsolo
    outright. Inside :meth:`interruptible` (connecting; then everything the job plan does
    before COMMAND starts, waiting for the lock included) the handler raises
    :class:`Interrupted`; from :meth:`forwarding` on, it forwards the signal to COMMAND;
    otherwise it only remembers it, and a remembered signal keeps COMMAND from being
    started at all. A signal the caller ignores stays ignored.
    """

    def __init__(self) -> None:
        self.received: list[int] = []
        self.child: Forwarding | None = None
        self._interruptible = False

    @property
    def first(self) -> int | None:
        return self.received[0] if self.received else None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        if self._interruptible:
            self._interruptible = False  # once: a second signal must not break the cleanup
            raise Interrupted(signum)
        if self.child is not None:
            self.child.forward(signum)

    @contextmanager
    def interruptible(self) -> Iterator[None]:
        """A wait that a signal may end (with :class:`Interrupted`)."""
        if (signum := self.first) is not None:
            raise Interrupted(signum)  # it came before the wait began
        self._interruptible = True
        try:
            yield
        finally:
            self._interruptible = False

    @contextmanager
    def forwarding(self, child: Forwarding) -> Iterator[None]:
        """While COMMAND is started and runs: a signal goes to it (or waits for its
        start); it no longer ends the attempt."""
        self._interruptible = False
        self.child = child
        try:
            yield
        finally:
            self.child = None

    @contextmanager
    def installed(self) -> Iterator[RunSignals]:
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        previous: dict[signal.Signals, Any] = {}
        try:
            for signum in FORWARDED_SIGNALS:
                if signal.getsignal(signum) is signal.SIG_IGN:
                    continue
                previous[signum] = signal.signal(signum, self._handle)
            yield self
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
