"""Semaphores from async code. Each module of ``_async/`` is the source of its namesake
in ``_sync/`` (``scripts/unasync.py``)."""
