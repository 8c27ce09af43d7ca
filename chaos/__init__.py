"""The chaos suite: ``python -m chaos`` measures pgsolo's reliability under faults, and the
database judges it (see ``chaos/suite.py``)."""
