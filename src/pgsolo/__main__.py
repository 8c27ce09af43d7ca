"""``python -m pgsolo``: the same as the ``pgsolo`` command."""

from pgsolo.cli import console

if __name__ == "__main__":  # also guards multiprocessing's re-import of the main module
    console()
