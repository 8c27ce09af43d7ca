"""Timing whole commands: a fresh interpreter, or the ``pgsolo`` command, per run."""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMAND_TIMEOUT_S = 120.0


@functools.cache
def _bytecode_cache() -> str:
    cache = tempfile.mkdtemp(prefix="pgsolo-bench-bytecode-")
    atexit.register(shutil.rmtree, cache, ignore_errors=True)
    return cache


def command_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a timed command runs in: this one, with a bytecode cache of its own.
    An installed package has its bytecode compiled (pip does it at install time), but a
    checkout run where ``PYTHONDONTWRITEBYTECODE`` is set (CI sets it) would compile every
    module of pgsolo's on every run, which no user pays: a third of ``pgsolo run -- true``
    on this machine. The cache goes to a directory of its own, never into the source tree."""
    env = {**os.environ, **(extra or {})}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = _bytecode_cache()
    return env


def pgsolo_command() -> list[str]:
    """The ``pgsolo`` console script next to this interpreter (what a user runs), or
    ``python -m pgsolo`` when it is not installed as one."""
    script = Path(sys.executable).with_name("pgsolo")
    return [str(script)] if script.exists() else [sys.executable, "-m", "pgsolo"]


def timed(argv: list[str], env: dict[str, str] | None = None) -> float:
    """Seconds from start to exit of ``argv``; it must exit 0."""
    started = time.perf_counter()
    proc = subprocess.run(  # noqa: S603 - our own interpreter and script, no shell
        argv,
        env=command_env(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        timeout=COMMAND_TIMEOUT_S,
        check=False,
    )
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{argv[-1]!r} exited {proc.returncode}: {proc.stderr[-500:]!r}")
    return elapsed
