"""pgsolo's benchmark suite: ``python -m benchmarks`` runs every scenario (see README.md)."""
