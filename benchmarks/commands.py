"""Timing whole commands: a fresh interpreter, or the ``pgsolo`` command, per run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

COMMAND_TIMEOUT_S = 120.0


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
        env={**os.environ, **(env or {})},
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
