// The SDK's own small Kafka interface: everything AgentWorker asks of a Kafka client, in the package's terms
// (no client library's types). Adapters: @platformatic/kafka (`src/platformatic.ts`, the default),
// KafkaJS (`src/kafkajs.ts`, `kafkajsClient`), both exported from the package index, and an in-memory one for tests
// (`src/memory.ts`, `@message-history/worker/testing`).
//
// Errors an adapter throws are told apart by `isOutage` (retry: Kafka unavailable), `isFenced` (another
// producer holds the transactional id) and `isTooLarge` (the record exceeds the broker's limit), which look at
// `retriable`, `type` and `name` (transactions.ts, worker.ts): an adapter maps its client's errors to those.
import type { ConnectionOptions } from './settings.js';
import type { Headers, TxProducer } from './transactions.js';

export type { Headers, Tx, TxProducer } from './transactions.js';

/** A record read from the enriched topic. */
export interface InRecord {
  topic: string;
  partition: number;
  /** The record's offset, as a decimal string (64-bit). */
  offset: string;
  value: Buffer | null;
  headers?: Headers;
}

/** A record to write (keyed: the key picks the partition with Java's murmur2, as the service's producer). */
export interface OutRecord {
  key: string;
  value: string;
  headers?: Headers;
}

export interface ConsumeOptions {
  topic: string;
  /** The member's whole new assignment of `topic`, called synchronously before any record of a partition new
   * to it is delivered. */
  onAssignment(partitions: number[]): void;
  /** One record; the next record of the same partition is delivered once this resolves (partitions run at the
   * same time, up to `partitionsConcurrently`). `heartbeat` keeps the group membership during a long wait.
   * A rejection is a consumer error: the adapter redelivers from the committed offset. */
  eachRecord(record: InRecord, heartbeat: () => Promise<void>): Promise<void>;
  partitionsConcurrently: number;
}

/** A transactional producer on one transactional id (exactly-once). `connect` initialises the id (fencing
 * its previous holder and completing its open transaction). */
export interface TransactionalProducer extends TxProducer {
  connect(): Promise<void>;
  disconnect(): Promise<void>;
}

/** A partition's offsets: `low` the first record kept, `high` the next offset to be written. */
export interface PartitionOffsets {
  partition: number;
  low: bigint;
  high: bigint;
}

export interface KafkaClient {
  /** The idempotent producer: connected before anything is sent. */
  connect(): Promise<void>;
  /** Joins the group, subscribes and starts delivering records (committed records only: read_committed);
   * resolves once running. */
  consume(options: ConsumeOptions): Promise<void>;
  /** Never resolves; rejects when the consumer stopped for good (a refusal such as "not authorized"). */
  readonly crashed: Promise<never>;
  /** Sends and waits for the acknowledgement of all in-sync replicas. */
  send(topic: string, records: OutRecord[]): Promise<void>;
  /** Commits the group's offset of `topic`'s `partition`: `next` is the next offset to read. */
  commit(topic: string, partition: number, next: bigint): Promise<void>;
  /** The group's committed offsets of `topic` (partitions without one are absent). */
  committed(topic: string): Promise<Map<number, bigint>>;
  offsets(topic: string): Promise<PartitionOffsets[]>;
  /** Reads `[start, end)` of each partition of `topic` without joining the worker's group, calling `each` per
   * record; resolves with the partitions not read to their end when `timeoutMs` is over (or [] when done). */
  readRange(
    topic: string,
    ranges: Map<number, { start: bigint; end: bigint }>,
    each: (partition: number, value: Buffer | null) => void,
    timeoutMs: number,
  ): Promise<number[]>;
  /** A new transactional producer (not connected) on `transactionalId`; absent when the adapter does not
   * run exactly-once (the worker then refuses `processingGuarantee: 'exactly-once'`). */
  transactional?(transactionalId: string): TransactionalProducer;
  /** Leaves the group: stops delivering, waits for the `eachRecord` calls in flight. */
  leave(): Promise<void>;
  /** Flushes and closes the producer. */
  close(): Promise<void>;
}

/** What the worker passes to an adapter when it makes its client. */
export interface ClientConfig extends ConnectionOptions {
  clientId: string;
  groupId: string;
  sessionTimeoutMs?: number;
  heartbeatIntervalMs?: number;
  requestTimeoutMs?: number;
}

/** Makes the worker's client: `platformaticClient` (the default), `kafkajsClient`, or `memoryClient(broker)`. */
export type KafkaClientFactory = (config: ClientConfig) => KafkaClient;
