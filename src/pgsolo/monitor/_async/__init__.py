"""The monitor's calls for async connections. Each module of ``_async/`` is the source of
its namesake in ``_sync/`` (``scripts/unasync.py``)."""
