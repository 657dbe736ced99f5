"""`python -m bench rows`: the recall path's row codec alone: raw reply documents to recalled rows' bytes.

    .venv/bin/python -m bench rows [--history 40] [--message-bytes 1024] [--seconds 2]

The rows are the bench's own (`bench.workload.seed_documents`: @mastra/mongodb's shape, ~1 KB of text each),
encoded as the raw BSON a reply holds. Per row, interleaved in one run: today's per-row path (decode with
aware datetimes, `row_from_doc`, `enriched_json`), the Python reference `rows_from_raw_py` (the same rule on
raw bytes) and the native codec (`message_history_native`, when installed). Single-threaded CPU time; compare
the ratios of one run, not machines.
"""

from __future__ import annotations

import argparse
import importlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import bson

from bench.workload import Workload, seed_documents
from storage.client import CODEC
from storage.documents import message_from_doc
from storage.recalled_rows import row_from_doc
from storage.row_codec import NATIVE_MODULE, rows_from_raw_py


def _today(raws: Sequence[bytes]) -> list[Any]:
    """Today's recall: the driver decodes (aware dates), `row_from_doc` builds a view, its bytes are taken."""
    out: list[Any] = []
    for raw in raws:
        doc: dict[str, Any] = bson.decode(raw, codec_options=CODEC)
        row = row_from_doc(doc, message_from_doc)
        out.append(row.enriched_json("memory") if row is not None else None)
    return out


def _per_row_us(fn: Callable[[Sequence[bytes]], Any], raws: Sequence[bytes], seconds: float) -> float:
    calls = 0
    started = time.process_time()
    while (spent := time.process_time() - started) < seconds:
        fn(raws)
        calls += 1
    return spent / (calls * len(raws)) * 1e6


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench rows", description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=int, default=40, help="rows per reply (default 40)")
    parser.add_argument("--message-bytes", type=int, default=1024, help="text per row (default 1024)")
    parser.add_argument("--seconds", type=float, default=2.0, help="CPU seconds per measurement (default 2)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    args = parser.parse_args(argv)
    w = Workload(threads=1, history=args.history, message_bytes=args.message_bytes)
    raws = [bson.encode(doc) for doc in seed_documents(w, 0)[1]]
    ways: dict[str, Callable[[Sequence[bytes]], Any]] = {"today": _today, "reference": rows_from_raw_py}
    try:
        ways["native"] = importlib.import_module(NATIVE_MODULE).rows_from_raw
    except ImportError:
        print(f"{NATIVE_MODULE} is not installed (deploy/local/stack install --all): native not measured")
    assert ways["reference"](raws) == [*ways.get("native", rows_from_raw_py)(raws)]  # same bytes
    avg = sum(map(len, raws)) / len(raws)
    print(
        f"{len(raws)} rows of {avg:.0f} B of BSON each; µs of CPU per row, {args.rounds} rounds interleaved"
    )
    results: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, fn in ways.items():
            results[name].append(_per_row_us(fn, raws, args.seconds))
    best = {name: min(values) for name, values in results.items()}
    for name, values in results.items():
        shown = " ".join(f"{v:6.2f}" for v in values)
        ratio = best["today"] / best[name]
        print(f"  {name:9s} {shown}   best {best[name]:6.2f} µs/row  ({ratio:5.1f}x today)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
