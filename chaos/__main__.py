"""``python -m chaos``: workers, faults and the database's verdict, in one run."""

import sys

from chaos.suite import main

if __name__ == "__main__":  # not again in the spawned worker processes
    sys.exit(main())
