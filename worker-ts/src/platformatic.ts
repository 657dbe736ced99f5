// The @platformatic/kafka adapter of the client seam (src/client.ts): `@message-history/worker/platformatic`.
// at-least-once only: `transactional` is absent, so AgentWorker refuses `processingGuarantee: 'exactly-once'`
// on it (the README's client note says why; KafkaJS keeps exactly-once). Keys go through its
// `compatibilityPartitioner` (Java's murmur2): its default one hashes differently and would put half the
// threads' responses on another partition than the service's.
import { randomUUID } from 'node:crypto';

import {
  Admin,
  compatibilityPartitioner,
  Consumer,
  FetchIsolationLevels,
  MessagesStreamModes,
  ProduceAcks,
  Producer,
  type Message,
  type MessagesStream,
} from '@platformatic/kafka';

import type { ClientConfig, ConsumeOptions, Headers, KafkaClient, PartitionOffsets } from './client.js';

const MECHANISMS = { plain: 'PLAIN', 'scram-sha-256': 'SCRAM-SHA-256', 'scram-sha-512': 'SCRAM-SHA-512' } as const;

/** A queue bound per partition: past it the stream waits (its own buffer holds 1,024 records more). */
const QUEUED_PER_PARTITION = 64;

function connection(config: ClientConfig): Record<string, unknown> {
  const out: Record<string, unknown> = { clientId: config.clientId, bootstrapBrokers: config.brokers };
  if (config.requestTimeoutMs !== undefined) out.requestTimeout = config.requestTimeoutMs;
  if (config.ssl !== undefined && config.ssl !== false) out.tls = config.ssl === true ? {} : { ...config.ssl };
  if (config.sasl !== undefined) {
    out.sasl = { mechanism: MECHANISMS[config.sasl.mechanism], username: config.sasl.username, password: config.sasl.password };
  }
  return out;
}

interface Found {
  apiId?: string;
  canRetry?: boolean;
  code?: string;
  errors?: unknown[];
  cause?: unknown;
}

/** Every error in `error`'s tree (platformatic nests them: MultipleErrors' `errors`, `cause`). */
function* tree(error: unknown, depth = 0): Generator<Found> {
  if (typeof error !== 'object' || error === null || depth > 8) return;
  const e = error as Found;
  yield e;
  for (const inner of e.errors ?? []) yield* tree(inner, depth + 1);
  if (e.cause !== undefined && e.cause !== error) yield* tree(e.cause, depth + 1);
}

/** The client's error in the seam's terms: `type` MESSAGE_TOO_LARGE or PRODUCER_FENCED, `retriable` for an
 * outage (a network error, a timeout, or a protocol error the client says can be retried). */
function mapped(error: unknown): Error {
  const all = [...tree(error)];
  const too = all.find((e) => e.apiId === 'MESSAGE_TOO_LARGE');
  const fenced = all.find((e) => e.apiId === 'INVALID_PRODUCER_EPOCH' || e.apiId === 'PRODUCER_FENCED');
  const outage = all.some((e) => e.canRetry === true || e.code === 'PLT_KFK_NETWORK' || e.code === 'PLT_KFK_TIMEOUT');
  const out = error instanceof Error ? error : new Error(String(error));
  return Object.assign(out, {
    ...(too ? { type: 'MESSAGE_TOO_LARGE' } : fenced ? { type: fenced.apiId } : {}),
    ...(outage && !too ? { retriable: true } : {}),
  });
}

async function guarded<T>(fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (error) {
    throw mapped(error);
  }
}

function headersOf(message: Message<Buffer, Buffer, Buffer, Buffer>): Headers | undefined {
  if (message.headers.size === 0) return undefined;
  const out: Headers = {};
  for (const [key, value] of message.headers) out[key.toString('utf8')] = value;
  return out;
}

/** The worker's client on @platformatic/kafka (at-least-once): `new AgentWorker(handler, { client:
 * platformaticClient, ... })`. */
export function platformaticClient(config: ClientConfig): KafkaClient {
  const base = connection(config);
  const producer = new Producer({ ...base, idempotent: true, partitioner: compatibilityPartitioner } as never) as Producer<Buffer, Buffer, Buffer, Buffer>;
  const consumer = new Consumer({
    ...base,
    groupId: config.groupId,
    ...(config.sessionTimeoutMs === undefined ? {} : { sessionTimeout: config.sessionTimeoutMs }),
    ...(config.heartbeatIntervalMs === undefined ? {} : { heartbeatInterval: config.heartbeatIntervalMs }),
  } as never) as Consumer<Buffer, Buffer, Buffer, Buffer>;
  let stream: MessagesStream<Buffer, Buffer, Buffer, Buffer> | undefined;
  let crash!: (error: unknown) => void;
  const crashed = new Promise<never>((_, reject) => {
    crash = reject;
  });
  crashed.catch(() => undefined);
  let closing = false;
  let running: Promise<void> = Promise.resolve();

  /** Reads the stream: one chain per partition (a record after the previous one's eachRecord), each bounded;
   * an eachRecord that rejects closes the stream and consumes again from the committed offsets. */
  async function pump(options: ConsumeOptions): Promise<void> {
    while (!closing) {
      const chains = new Map<number, { tail: Promise<void>; queued: number }>();
      let failed: unknown;
      stream = await consumer.consume({
        topics: [options.topic],
        mode: MessagesStreamModes.COMMITTED,
        fallbackMode: 'earliest',
        autocommit: false,
        isolationLevel: FetchIsolationLevels.READ_COMMITTED,
      } as never);
      try {
        for await (const message of stream as AsyncIterable<Message<Buffer, Buffer, Buffer, Buffer>>) {
          if (closing || failed !== undefined) break;
          const chain = chains.get(message.partition) ?? { tail: Promise.resolve(), queued: 0 };
          chains.set(message.partition, chain);
          chain.queued += 1;
          const headers = headersOf(message);
          const record = {
            topic: message.topic,
            partition: message.partition,
            offset: message.offset.toString(),
            value: message.value ?? null,
            ...(headers ? { headers } : {}),
          };
          chain.tail = chain.tail
            .then(() => (failed === undefined && !closing ? options.eachRecord(record, async () => undefined) : undefined))
            .catch((error: unknown) => {
              failed ??= error;
            })
            .finally(() => {
              chain.queued -= 1;
            });
          if (chain.queued >= QUEUED_PER_PARTITION) await chain.tail;
        }
      } finally {
        await Promise.allSettled([...chains.values()].map((c) => c.tail));
        await stream.close().catch(() => undefined);
      }
      if (failed === undefined) return;
    }
  }

  return {
    crashed,
    connect: async () => undefined,
    async consume(options) {
      consumer.on('consumer:group:join', (payload) => {
        const mine = payload.assignments?.find((a) => a.topic === options.topic);
        options.onAssignment(mine?.partitions ?? []);
      });
      running = pump(options).catch((error: unknown) => {
        if (!closing) crash(mapped(error));
      });
    },
    send: (topic, records) =>
      guarded(async () => {
        await producer.send({
          acks: ProduceAcks.ALL,
          messages: records.map((r) => ({
            topic,
            key: Buffer.from(r.key, 'utf8'),
            value: Buffer.from(r.value, 'utf8'),
            ...(r.headers
              ? {
                  headers: new Map(
                    Object.entries(r.headers)
                      .filter(([, v]) => v !== undefined)
                      .map(([k, v]) => [Buffer.from(k), Buffer.from(String(Array.isArray(v) ? v[0] : v))]),
                  ),
                }
              : {}),
          })),
        });
      }),
    commit: (topic, partition, next) =>
      guarded(() => consumer.commit({ offsets: [{ topic, partition, offset: next, leaderEpoch: 0 }] } as never)),
    committed: (topic) =>
      guarded(async () => {
        const partitions = (await consumer.listOffsets({ topics: [topic] })).get(topic)?.map((_, i) => i) ?? [];
        const found = (await consumer.listCommittedOffsets({ topics: [{ topic, partitions }] })).get(topic) ?? [];
        const out = new Map<number, bigint>();
        found.forEach((offset, partition) => {
          if (offset >= 0n) out.set(partition, offset);
        });
        return out;
      }),
    offsets: (topic) =>
      guarded(async (): Promise<PartitionOffsets[]> => {
        const high = (await consumer.listOffsets({ topics: [topic] })).get(topic) ?? [];
        const low = (await consumer.listOffsets({ topics: [topic], timestamp: -2n })).get(topic) ?? [];
        return high.map((h, partition) => ({ partition, low: low[partition] ?? 0n, high: h }));
      }),
    async readRange(topic, ranges, each, timeoutMs) {
      const groupId = `${config.groupId}.read-back.${randomUUID()}`;
      const reader = new Consumer({ ...base, groupId } as never) as Consumer<Buffer, Buffer, Buffer, Buffer>;
      const remaining = new Set(ranges.keys());
      let timer: NodeJS.Timeout | undefined;
      try {
        const reading = await reader.consume({
          topics: [topic],
          mode: MessagesStreamModes.MANUAL,
          offsets: [...ranges].map(([partition, { start }]) => ({ topic, partition, offset: start })),
          autocommit: false,
        } as never);
        const late = new Promise<void>((resolve) => {
          timer = setTimeout(resolve, timeoutMs);
        });
        const read = (async () => {
          for await (const message of reading as AsyncIterable<Message<Buffer, Buffer, Buffer, Buffer>>) {
            const range = ranges.get(message.partition);
            if (range === undefined) continue;
            if (message.offset >= range.start && message.offset < range.end) each(message.partition, message.value ?? null);
            if (message.offset >= range.end - 1n) remaining.delete(message.partition);
            if (remaining.size === 0) break;
          }
        })();
        await Promise.race([read, late]);
        await reading.close().catch(() => undefined);
        return [...remaining];
      } finally {
        clearTimeout(timer);
        await reader.close().catch(() => undefined);
        const admin = new Admin(base as never);
        await admin.deleteGroups({ groups: [groupId] }).catch(() => undefined);
        await admin.close().catch(() => undefined);
      }
    },
    async leave() {
      closing = true;
      await stream?.close().catch(() => undefined);
      await running;
      await consumer.close().catch(() => undefined);
    },
    close: () => producer.close(),
  };
}
