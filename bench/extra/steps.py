"""`python -m bench steps`: where an idle recall's and an idle persist's milliseconds go, step by step.

    eval "$(deploy/local/stack env)"
    .venv/bin/python -m bench steps [--threads 50] [--idle-turns 100] [--spans]

The idle line's setting (one turn at a time through `message-history run`, interleaved with a bare
forwarder), both processes watched from inside by `bench.stepwatch`; `bench.steps` says what each segment
is. The workload flags are the main command's (`python -m bench --help`); the record goes to `--out` with
the steps under `environment.steps`, and the table to stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from collections.abc import Sequence

from bench import cli, targets, traces
from bench.run import run


def parser() -> argparse.ArgumentParser:
    p = cli.parser()
    p.prog = "python -m bench steps"
    p.description = __doc__.split("\n\n")[0] if __doc__ else None
    p.add_argument("--spans", action="store_true", help="record the service's OpenTelemetry spans too")
    p.set_defaults(threads=50, idle_turns=100, batch=500)
    return p


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    options = cli.options_from(args, ["steps", *argv])
    options = dataclasses.replace(options, steps=True, steps_spans=args.spans)
    record, path, _ = asyncio.run(run(options))
    summary = record["environment"].get("steps")
    load = record["environment"].get("load_average") or {}
    if summary:
        print(traces.render(summary))
    print(f"\nload average (1 min) during the run: {targets.load_summary(load)}")
    print(f"results: {path}")
    return 130 if record["environment"].get("interrupted") or not summary else 0
