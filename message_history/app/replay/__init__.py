"""`message-history replay`: backfill or repair MongoDB from a topic, bounded, idempotent, beside the service.

How it stays out of the live service's way and still gives the live result:

* It reads with `assign()` and `group_id=None`: no group, no commits, so the live group's committed offsets
  never move. Each partition of the range gets its own consumer and task (at most `--concurrency` at once).
* Records go through the live paths' own batch handlers (`consumers.persist.PersistHandler`; for
  `--emit-to`, `consumers.recall.RecallHandler`): decode, `MessageHistory.persist_turn` through the
  collecting storage, one `save_many` per batch. Writes are upserts by message id with `createdAt` only on
  insert, so the documents are the ones the live service writes, and replaying twice changes nothing.
* The handlers "publish" into a recorder: by default nothing leaves (`--emit-persisted` / `--emit-to` send the
  events on); either way the outcome of every record is counted for the progress display and the summary.
* The storage is wrapped to count, per batch, which message ids were already stored (one `$in` query) and, for
  `--dry-run`, to answer the writes without writing (threads that would be created are remembered, so later
  batches see them as the live service would).
* Bad records: counted, logged with partition and offset, dead-lettered with the live service's headers
  (`producers.dead_letters`), or with `--skip-invalid` only reported (`--invalid-report FILE`, JSONL).
* Outages: the live loop's own policy and retry loop (`consumers.runtime.retry`, the retry settings); after
  `--max-retry-s` without success it stops with exit 1 and the offsets to resume from.
* SIGINT / SIGTERM: every partition finishes the batch in hand, then the `--from-offsets ...` flag that
  resumes the work is printed (exit 130). A second signal abandons the batches in hand (the printed offsets
  are still a correct resume point).

The end of every partition is fixed when the replay starts (its end offset then, or the first offset at
`--until-timestamp`), so a replay finishes while producers keep writing.

One job per module: `options` (the command line, checked), `plan` (the pure rules: offsets, ranges, rate,
tallies), `sinks` (where the handlers' outputs go: recording publishers, the counted or dry-run storage, the
JSONL report of bad records), `runner` (one batch with the loop's retry, the partitions' workers), `progress`
(bar, log lines, summary) and `command` (the entry point: the run, its summary, the signals).
"""
