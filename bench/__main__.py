"""`python -m bench` (from the repository root): see `bench.cli` and `docs/benchmarks.md`."""

import sys

from bench.cli import main

sys.exit(main())
