"""``python -m benchmarks``: the whole suite against one server, in one process run."""

import sys

from benchmarks.suite import main

if __name__ == "__main__":  # not again in the contention scenario's spawned workers
    sys.exit(main())
