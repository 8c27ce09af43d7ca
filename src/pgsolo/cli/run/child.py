"""COMMAND as a child process: started without a shell, in a process group of its own
when stdin is not a terminal, killed with pgsolo (a parent-death signal); and every
process it starts, which pgsolo adopts (a subreaper, Linux), signals and reaps."""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from contextlib import suppress
from functools import cache
from pathlib import Path

from ..._logging import cli_logger as logger
from .signals import TERMINAL_SIGNALS, signal_name

__all__ = ["EXIT_CANNOT_EXECUTE", "EXIT_NOT_FOUND", "Child", "not_found", "stdin_is_terminal"]


EXIT_NOT_FOUND = 127  # as a shell: the command does not exist


EXIT_CANNOT_EXECUTE = 126  # as a shell: it exists but cannot be executed


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that makes COMMAND die with pgsolo (Linux).

    If pgsolo itself is killed (SIGKILL, the OOM killer), its connection closes and the
    server releases the lock at once, while COMMAND would run on unprotected and a
    second host could start the same work. The kernel's parent-death signal stops it.
    """
    if not sys.platform.startswith("linux"):
        return None
    parent = os.getpid()
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before the fork

    def arm() -> None:  # runs in the child, between fork and exec
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # pgsolo died before the signal was armed
            os._exit(128 + signal.SIGKILL)

    return arm


_PR_SET_PDEATHSIG = 1


class Child:
    """COMMAND as a child process and every process it starts: started, signalled (its
    process group when it leads one, see the module docstring; on Linux every process it
    started too, wherever it went), sent the signals pgsolo forwards, and waited for.

    On Linux pgsolo is a child subreaper while COMMAND and what it started run
    (``PR_SET_CHILD_SUBREAPER``): a process orphaned below it (a shell's background job
    once the shell exited, a ``setsid`` or double-forking daemon) is re-parented to
    pgsolo rather than to init, so pgsolo sees it, waits for it with the lock held, signals
    it after a lost lock and reaps it once it exits (no zombie, PID 1 of a container
    included). Elsewhere, what pgsolo sees of them is COMMAND's process group.
    """

    def __init__(self, command: list[str], *, own_group: bool) -> None:
        self.command = command
        self.own_group = own_group
        self.proc: subprocess.Popen[bytes] | None = None
        self.pending: list[int] = []  # received while the child was being started
        self.forwarded: list[int] = []  # logged by the main loop, not the handler
        self.subreaper: _Subreaper | None = None
        self.signalled: set[int] = set()  # pids sent SIGTERM by signal_all
        self.group_signalled = False  # signal_all sent the group its SIGTERM

    def start(self) -> subprocess.Popen[bytes]:
        self.subreaper = _Subreaper.become()
        # No shell: COMMAND's arguments reach it exactly as given. stdio is inherited.
        try:
            try:
                self.proc = self._spawn(self.command)
            except OSError as exc:
                if exc.errno != errno.ENOEXEC:
                    raise
                # A script without a #! line: /bin/sh runs it, as every shell and
                # execvp(3) do, so that 126 means what it means from a shell.
                self.proc = self._spawn(["/bin/sh", _found(self.command[0]), *self.command[1:]])
        except BaseException:
            self.close()
            raise
        pending, self.pending = self.pending, []
        for signum in pending:  # arrived while the child was being started
            self.forward(signum)
        return self.proc

    def _spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(  # noqa: S603
            argv,
            preexec_fn=_die_with_parent(),  # noqa: PLW1509 - no threads of pgsolo's run then
            process_group=0 if self.own_group else None,
        )

    def close(self) -> None:
        """Stop being a subreaper (once nothing COMMAND started is left)."""
        if self.subreaper is not None:
            self.subreaper.leave()
            self.subreaper = None

    @property
    def target(self) -> str:
        """Who :meth:`signal` reaches, for log lines."""
        pid = self.proc.pid if self.proc is not None else 0
        return f"process group {pid}" if self.own_group else f"pid {pid}"

    @property
    def exited(self) -> bool:
        return self.proc is not None and self.proc.returncode is not None

    def signal(self, signum: int) -> None:
        """Send ``signum`` to COMMAND: its whole process group when it leads one (which
        outlives COMMAND's own process while anything it started still runs)."""
        proc = self.proc
        if proc is None:
            return
        if not self.own_group:
            _send(proc, signum)
            return
        # Safe after COMMAND was reaped: a pid still in use as a process group id is never
        # given to a new process, and an empty group is an error (ESRCH).
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signum)

    def signal_all(self, signum: int) -> None:
        """Send ``signum`` to COMMAND and to every process it started that still runs: on
        Linux to each descendant of pgsolo (a ``setsid`` daemon has left the process
        group), elsewhere to COMMAND's process group. SIGTERM reaches each process once,
        however often this is called: a process started since gets its own next time."""
        once = signum == signal.SIGTERM
        if self.subreaper is None:
            if not (once and self.group_signalled):
                if self.exited and self.own_group:
                    with suppress(ProcessLookupError, PermissionError):
                        os.killpg(self.proc.pid, signum)  # type: ignore[union-attr]
                elif not self.exited:
                    self.signal(signum)
                self.group_signalled = self.group_signalled or once
            return
        for pid in self.subreaper.descendants():
            if once and pid in self.signalled:
                continue
            with suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signum)
            if once:
                self.signalled.add(pid)

    def reap(self) -> None:
        """Reap the processes re-parented to pgsolo that have exited (COMMAND's own is
        :class:`subprocess.Popen`'s to reap)."""
        if self.subreaper is not None and self.proc is not None:
            self.subreaper.reap(keep=self.proc.pid)

    def lingering(self) -> int:
        """How many processes COMMAND started still run (COMMAND's own not counted): on
        Linux every descendant of pgsolo, elsewhere 1 while COMMAND's process group has
        a member (0 when stdin is a terminal: there is no group of COMMAND's own)."""
        proc = self.proc
        if proc is None:
            return 0
        if self.subreaper is not None:
            self.reap()
            return sum(1 for pid in self.subreaper.descendants() if pid != proc.pid)
        if not self.own_group:
            return 0
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            return 0
        except PermissionError:
            return 1
        return 1 if proc.returncode is not None else 0

    def forward(self, signum: int) -> None:
        proc = self.proc
        if proc is None:
            self.pending.append(signum)
            return
        if proc.returncode is not None:
            # COMMAND is gone and pgsolo waits for what it left running: that is who the
            # signal was meant for (a service manager stopping pgsolo).
            self.signal_all(signum)
            self.forwarded.append(signum)
            return
        if signum in TERMINAL_SIGNALS and _terminal_sent_it_too(proc.pid):
            return
        # A signal handler must not log or print: the main thread may be halfway
        # through a write to the same stream.
        self.signal(signum)
        self.forwarded.append(signum)

    def log_forwarded(self) -> None:
        while self.forwarded and self.proc is not None:
            signum = self.forwarded.pop(0)
            target = "the processes it left running" if self.exited else self.target
            logger.info("pgsolo: forwarded %s to %s", signal_name(signum), target)


class _Subreaper:
    """pgsolo as a child subreaper (Linux): what COMMAND orphans comes back to pgsolo.

    The processes that were already pgsolo's children before COMMAND started (none for
    the command line; a test calling it in process may have some) are not COMMAND's:
    never counted, signalled or reaped.
    """

    def __init__(self, prctl: Callable[..., int], was_subreaper: bool) -> None:
        self._prctl = prctl
        self._was_subreaper = was_subreaper
        self._me = os.getpid()
        self._others = frozenset(_children_of(self._me))

    @classmethod
    def become(cls) -> _Subreaper | None:
        """pgsolo as a subreaper, or None where the kernel has none (not Linux, < 3.4)."""
        if not sys.platform.startswith("linux") or not hasattr(os, "waitid"):
            return None
        prctl = ctypes.CDLL(None, use_errno=True).prctl
        flag = ctypes.c_int(0)
        if prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(flag), 0, 0, 0) != 0:
            return None
        if not flag.value and prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
            return None
        return cls(prctl, bool(flag.value))

    def leave(self) -> None:
        if not self._was_subreaper:
            self._prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)

    def descendants(self) -> list[int]:
        """Every live descendant of pgsolo but the children it had before COMMAND, read
        from /proc (a process that forks meanwhile may be missed: callers look again)."""
        found: list[int] = []
        parents = [pid for pid in _children_of(self._me) if pid not in self._others]
        while parents:
            pid = parents.pop()
            found.append(pid)
            parents.extend(_children_of(pid))
        return found

    def reap(self, *, keep: int) -> None:
        """Reap pgsolo's exited children, but ``keep`` and those it had before COMMAND."""
        for pid in _children_of(self._me):
            if pid == keep or pid in self._others:
                continue
            with suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def _children_of(pid: int) -> list[int]:
    """The children of ``pid`` (zombies included), from /proc: each thread's ``children``
    file where the kernel has them (CONFIG_PROC_CHILDREN), else a scan of every process's
    parent; none once ``pid`` is gone."""
    if not _children_files():
        return [child for child, parent in _parents().items() if parent == pid]
    children: list[int] = []
    with suppress(OSError):  # pid is gone
        for task in Path(f"/proc/{pid}/task").iterdir():
            with suppress(OSError):  # that thread ended meanwhile
                children.extend(int(p) for p in (task / "children").read_text().split())
    return children


@cache
def _children_files() -> bool:
    return Path("/proc/thread-self/children").exists()


def _parents() -> dict[int, int]:
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with suppress(OSError, IndexError, ValueError):
                stat = (entry / "stat").read_text()
                parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return parents


_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


def stdin_is_terminal() -> bool:
    return os.isatty(0)


def _send(proc: subprocess.Popen[bytes], signum: int) -> None:
    with suppress(ProcessLookupError):
        proc.send_signal(signum)  # does nothing once the child has been reaped


def _terminal_sent_it_too(pid: int) -> bool:
    """Whether ``pid`` is in the foreground process group of our terminal: then a Ctrl-C
    (or Ctrl-\\) typed there reached it already, and forwarding would deliver it twice."""
    try:
        group = os.getpgid(pid)
    except OSError:
        return False
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd) and os.tcgetpgrp(fd) == group:
                return True
        except OSError:
            continue
    return False


def _found(program: str) -> str:
    """``program``'s path, searched in PATH as exec did if it has no slash."""
    if "/" in program:
        return program
    import shutil  # noqa: PLC0415 - only for a script without a #! line

    return shutil.which(program) or program


def not_found(exc: OSError) -> bool:
    return isinstance(exc, FileNotFoundError | NotADirectoryError)
