// What this package does, one key per row of the parity table in docs/worker.md ("Parity: Python and
// TypeScript"); tests/interop/test_worker_ts_parity.py checks the table and this list name the same features.
export const CAPABILITIES = [
  'packaging',
  'kafka-client',
  'partitioner',
  'event-types',
  'reply-validation',
  'failed-turn',
  'turn-signal',
  'retry-later',
  'oversized-reply',
  'concurrency',
  'delivery',
  'duplicates',
  'read-back',
  'exactly-once',
  'zombie-fencing',
  'shutdown',
  'rebalance',
  'security',
  'tracing',
  'testing',
  'typed-events',
  'mastra',
  'observer',
] as const;

export type Capability = (typeof CAPABILITIES)[number];
