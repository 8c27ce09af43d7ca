"""A candidate in a process of its own, for tests/leadership/test_takeover.py: it leads
``name`` on ``dsn`` (argv), says so on stdout with its term's token, and leads until it
is killed."""

from __future__ import annotations

import sys
import time

import pgsolo


def main(dsn: str, name: str) -> None:
    with pgsolo.leader(dsn, name) as term:
        print(f"leading {term.token} {term.backend_pid}", flush=True)
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
