"""Side measurements, each a subcommand of `python -m bench` (see `bench.cli.SIDE` and docs/benchmarks.md)."""
