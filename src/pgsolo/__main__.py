"""``python -m pgsolo``: the same as the ``pgsolo`` command."""

import sys

from pgsolo.cli import main

if __name__ == "__main__":  # also guards multiprocessing's re-import of the main module
    sys.exit(main())
