"""The benchmark harness: `python -m bench` (see `docs/benchmarks.md`)."""
