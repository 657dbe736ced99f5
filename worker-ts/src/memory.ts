// An in-memory Kafka behind the client seam (src/client.ts), for handler tests without a broker: the real
// AgentWorker runs on it (`TestHarness` in `@message-history/worker/testing`). Keys are partitioned with
// Java's murmur2, as the service's producer (aiokafka) does, so a thread's records land where they would.
// One consumer group member at a time per group; `assign` moves its partitions (a rebalance, as the clients
// do it: the records in flight are awaited, then the new assignment is given); transactions are kept until their commit
// (readers see committed records only, as read_committed); a transactional id's newest producer fences the
// older ones.
import type {
  ClientConfig,
  ConsumeOptions,
  Headers,
  KafkaClient,
  KafkaClientFactory,
  OutRecord,
  PartitionOffsets,
  TransactionalProducer,
  Tx,
} from './client.js';

/** Kafka's murmur2 (org.apache.kafka.common.utils.Utils.murmur2) of `data`, as a signed 32-bit integer. */
export function murmur2(data: Uint8Array): number {
  const length = data.length;
  const seed = 0x9747b28c;
  const m = 0x5bd1e995;
  const r = 24;
  let h = (seed ^ length) | 0;
  const length4 = length >> 2;
  for (let i = 0; i < length4; i += 1) {
    const i4 = i * 4;
    let k = (data[i4]! & 0xff) + ((data[i4 + 1]! & 0xff) << 8) + ((data[i4 + 2]! & 0xff) << 16) + ((data[i4 + 3]! & 0xff) << 24);
    k = Math.imul(k, m);
    k ^= k >>> r;
    k = Math.imul(k, m);
    h = Math.imul(h, m);
    h ^= k;
  }
  const rest = length % 4;
  const tail = length & ~3;
  if (rest === 3) h ^= (data[tail + 2]! & 0xff) << 16;
  if (rest >= 2) h ^= (data[tail + 1]! & 0xff) << 8;
  if (rest >= 1) {
    h ^= data[tail]! & 0xff;
    h = Math.imul(h, m);
  }
  h ^= h >>> 13;
  h = Math.imul(h, m);
  h ^= h >>> 15;
  return h | 0;
}

/** The partition Java's default partitioner (and aiokafka's, the service's) gives a key. */
export function javaPartition(key: string, partitions: number): number {
  return (murmur2(Buffer.from(key, 'utf8')) & 0x7fffffff) % partitions;
}

export interface StoredRecord {
  offset: bigint;
  key: string | null;
  value: Buffer | null;
  headers: Headers;
}

const kafkaError = (message: string, fields: Record<string, unknown>): Error => Object.assign(new Error(message), fields);

/** The in-memory broker: topics, committed group offsets, transactional ids. Share one between the clients
 * (workers) and the test that writes requests and reads responses. */
export class MemoryKafka {
  private readonly topics = new Map<string, StoredRecord[][]>();
  private readonly groups = new Map<string, Map<string, bigint>>();
  private readonly epochs = new Map<string, number>();
  private readonly listeners = new Set<() => void>();
  /** Per group, its member (a worker's client consuming). */
  private readonly members = new Map<string, { assign(partitions: number[]): Promise<void> }>();

  constructor(
    /** Partitions of a topic created on first use. */
    readonly defaultPartitions = 1,
    /** A record whose value is longer is refused (MESSAGE_TOO_LARGE), as the broker's message.max.bytes. */
    readonly maxRecordBytes = 1_048_576,
  ) {}

  createTopic(name: string, partitions: number): void {
    if (!this.topics.has(name)) this.topics.set(name, Array.from({ length: partitions }, () => []));
  }

  partitions(topic: string): StoredRecord[][] {
    this.createTopic(topic, this.defaultPartitions);
    return this.topics.get(topic)!;
  }

  /** Appends records (keyed with Java's murmur2); returns each record's partition and offset. */
  append(topic: string, records: OutRecord[]): { partition: number; offset: bigint }[] {
    for (const record of records) {
      if (Buffer.byteLength(record.value) > this.maxRecordBytes) {
        throw kafkaError('the record is larger than the broker accepts', { type: 'MESSAGE_TOO_LARGE' });
      }
    }
    const partitions = this.partitions(topic);
    const placed = records.map((record) => {
      const partition = javaPartition(record.key, partitions.length);
      const log = partitions[partition]!;
      const offset = BigInt(log.length);
      log.push({ offset, key: record.key, value: Buffer.from(record.value, 'utf8'), headers: { ...record.headers } });
      return { partition, offset };
    });
    this.changed();
    return placed;
  }

  /** Every record of `topic`, partition by partition. */
  records(topic: string): (StoredRecord & { partition: number })[] {
    return this.partitions(topic).flatMap((log, partition) => log.map((r) => ({ ...r, partition })));
  }

  committed(group: string, topic: string): Map<number, bigint> {
    const out = new Map<number, bigint>();
    for (const [key, offset] of this.groups.get(group) ?? []) {
      const [t, p] = key.split('\u0000');
      if (t === topic) out.set(Number(p), offset);
    }
    return out;
  }

  commit(group: string, topic: string, partition: number, next: bigint): void {
    let offsets = this.groups.get(group);
    if (offsets === undefined) this.groups.set(group, (offsets = new Map()));
    offsets.set(`${topic}\u0000${partition}`, next);
  }

  /** A rebalance of `group`: its member now owns `partitions` of the topic it consumes (others taken away,
   * new ones read from the committed offset). Resolves once the member has its new assignment. */
  async assign(group: string, partitions: number[]): Promise<void> {
    const member = this.members.get(group);
    if (member === undefined) throw new Error(`no member consumes in group ${group}`);
    await member.assign(partitions);
  }

  /** @internal the member of `group` (the memory client, while it consumes). */
  join(group: string, member: { assign(partitions: number[]): Promise<void> } | undefined): void {
    if (member === undefined) this.members.delete(group);
    else this.members.set(group, member);
  }

  /** A new epoch of `transactionalId`: producers of older epochs are fenced. */
  initProducer(transactionalId: string): number {
    const epoch = (this.epochs.get(transactionalId) ?? 0) + 1;
    this.epochs.set(transactionalId, epoch);
    return epoch;
  }

  epoch(transactionalId: string): number {
    return this.epochs.get(transactionalId) ?? 0;
  }

  /** Resolves at the next append (or `signal`'s abort). */
  next(signal: AbortSignal): Promise<void> {
    return new Promise((resolve) => {
      if (signal.aborted) return resolve();
      const done = (): void => {
        this.listeners.delete(done);
        signal.removeEventListener('abort', done);
        resolve();
      };
      this.listeners.add(done);
      signal.addEventListener('abort', done, { once: true });
    });
  }

  private changed(): void {
    for (const listener of [...this.listeners]) listener();
  }
}

/** The worker's client on a MemoryKafka: `new AgentWorker(handler, { client: memoryClient(broker), ... })`. */
export function memoryClient(broker: MemoryKafka): KafkaClientFactory {
  return (config: ClientConfig) => new MemoryClient(broker, config);
}

class MemoryClient implements KafkaClient {
  readonly crashed = new Promise<never>(() => undefined);
  private readonly stopping = new AbortController();
  /** Per owned partition: its read loop and what stops it (a rebalance taking the partition away). */
  private readonly loops = new Map<number, { done: Promise<void>; stop: AbortController }>();

  constructor(
    private readonly broker: MemoryKafka,
    private readonly config: ClientConfig,
  ) {}

  async connect(): Promise<void> {}

  async consume(options: ConsumeOptions): Promise<void> {
    const start = (partitions: number[]): void => {
      options.onAssignment(partitions);
      for (const partition of partitions) {
        if (this.loops.has(partition)) continue;
        const stop = new AbortController();
        this.loops.set(partition, { done: this.loop(options, partition, AbortSignal.any([this.stopping.signal, stop.signal])), stop });
      }
    };
    start(this.broker.partitions(options.topic).map((_, i) => i));
    this.broker.join(this.config.groupId, {
      assign: async (partitions) => {
        // as the clients: the partitions taken away stop, their eachRecord in flight is awaited, then the
        // new assignment is given (synchronously before any record of a partition new to the member)
        const gone = [...this.loops].filter(([partition]) => !partitions.includes(partition));
        for (const [, { stop }] of gone) stop.abort();
        await Promise.all(gone.map(([, { done }]) => done));
        for (const [partition] of gone) this.loops.delete(partition);
        start(partitions);
      },
    });
  }

  /** One partition: from the committed offset, each record after the previous one's eachRecord resolved; an
   * eachRecord that rejects sends the partition back to the committed offset (as a client restarting). */
  private async loop(options: ConsumeOptions, partition: number, signal: AbortSignal): Promise<void> {
    const log = this.broker.partitions(options.topic)[partition]!;
    let position = this.broker.committed(this.config.groupId, options.topic).get(partition) ?? 0n;
    while (!signal.aborted) {
      const record = log[Number(position)];
      if (record === undefined) {
        await this.broker.next(signal);
        continue;
      }
      try {
        await options.eachRecord(
          { topic: options.topic, partition, offset: record.offset.toString(), value: record.value, headers: record.headers },
          async () => undefined,
        );
        position += 1n;
      } catch {
        position = this.broker.committed(this.config.groupId, options.topic).get(partition) ?? 0n;
        await new Promise((resolve) => setImmediate(resolve));
      }
    }
  }

  async send(topic: string, records: OutRecord[]): Promise<void> {
    this.broker.append(topic, records);
  }

  async commit(topic: string, partition: number, next: bigint): Promise<void> {
    this.broker.commit(this.config.groupId, topic, partition, next);
  }

  async committed(topic: string): Promise<Map<number, bigint>> {
    return this.broker.committed(this.config.groupId, topic);
  }

  async offsets(topic: string): Promise<PartitionOffsets[]> {
    return this.broker.partitions(topic).map((log, partition) => ({ partition, low: 0n, high: BigInt(log.length) }));
  }

  async readRange(
    topic: string,
    ranges: Map<number, { start: bigint; end: bigint }>,
    each: (partition: number, value: Buffer | null) => void,
  ): Promise<number[]> {
    const logs = this.broker.partitions(topic);
    for (const [partition, { start, end }] of ranges) {
      for (const record of logs[partition]?.slice(Number(start), Number(end)) ?? []) each(partition, record.value);
    }
    return [];
  }

  transactional(transactionalId: string): TransactionalProducer {
    const broker = this.broker;
    let epoch = 0;
    const fenced = (): void => {
      if (broker.epoch(transactionalId) !== epoch) {
        throw kafkaError(`transactional id ${transactionalId} has a newer producer`, { type: 'PRODUCER_FENCED' });
      }
    };
    return {
      async connect() {
        epoch = broker.initProducer(transactionalId);
      },
      async disconnect() {},
      async transaction(): Promise<Tx> {
        fenced();
        const records: { topic: string; messages: OutRecord[] }[] = [];
        const offsets: { group: string; topic: string; partition: number; next: bigint }[] = [];
        return {
          async send(record) {
            fenced();
            for (const m of record.messages) {
              if (Buffer.byteLength(m.value) > broker.maxRecordBytes) {
                throw kafkaError('the record is larger than the broker accepts', { type: 'MESSAGE_TOO_LARGE' });
              }
            }
            records.push({ topic: record.topic, messages: record.messages.map((m) => ({ ...m })) as OutRecord[] });
          },
          async sendOffsets({ consumerGroupId, topics }) {
            fenced();
            for (const t of topics) {
              for (const p of t.partitions) {
                offsets.push({ group: consumerGroupId, topic: t.topic, partition: p.partition, next: BigInt(p.offset) });
              }
            }
          },
          async commit() {
            fenced();
            for (const r of records) broker.append(r.topic, r.messages);
            for (const o of offsets) broker.commit(o.group, o.topic, o.partition, o.next);
          },
          async abort() {
            records.length = 0;
            offsets.length = 0;
          },
        };
      },
    };
  }

  async leave(): Promise<void> {
    this.stopping.abort();
    await Promise.all([...this.loops.values()].map((l) => l.done));
    this.broker.join(this.config.groupId, undefined);
  }

  async close(): Promise<void> {}
}
