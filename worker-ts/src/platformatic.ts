// The @platformatic/kafka adapter of the client seam (src/client.ts): the worker's default client (also
// exported from `@message-history/worker/platformatic`).
// Both modes: under exactly-once a transactional producer per owned partition (as on KafkaJS), the consumed
// offset added to its transaction with the consumer's group metadata (TxnOffsetCommit with the generation and
// member id: a member that lost its generation cannot commit). Keys go through its
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

import { isOutage } from './transactions.js';
import type {
  ClientConfig,
  ConsumeOptions,
  Headers,
  KafkaClient,
  OutRecord,
  PartitionOffsets,
  TransactionalProducer,
  Tx,
} from './client.js';

const MECHANISMS = { plain: 'PLAIN', 'scram-sha-256': 'SCRAM-SHA-256', 'scram-sha-512': 'SCRAM-SHA-512' } as const;

/** A queue bound per partition: past it the stream waits (its own buffer holds 1,024 records more). */
const QUEUED_PER_PARTITION = 64;
/** After the stream gave up fetching (an outage): the pause before it reads again. */
const OUTAGE_PAUSE_MS = 1_000;
/** A transactional producer's own retries of one request, then the error is the worker's (runTransaction's
 * outage loop, a commit in doubt settled). The client's default for an idempotent producer is
 * Number.MAX_SAFE_INTEGER (any value <= 1 is replaced by it): a request that could not succeed after a frozen
 * broker (seen: the offsets of a transaction, TxnOffsetCommit) was retried for ever, neither answered nor
 * failed, and the turn and its partition stalled. */
const TX_RETRIES = 5;

/** The pause before a transactional request's retry `attempt`: CONCURRENT_TRANSACTIONS (the previous
 * transaction's markers still being written, after every commit) is over in milliseconds, an outage is not.
 * (The client's default, 1 s for any error, made each transaction after the first wait a second.) */
function txRetryDelay(_client: unknown, _operation: string, attempt: number, _retries: number, error: unknown): number {
  const concurrent = [...tree(error)].some((e) => e.apiId === 'CONCURRENT_TRANSACTIONS');
  return concurrent ? Math.min(10 * attempt, 100) : Math.min(200 * 2 ** (attempt - 1), 2_000);
}

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

/** A producer's state the broker no longer accepts (its sequence numbers out of step after a batch lost in an
 * outage, its producer id forgotten): the client does not recover it by itself (it resends the same state for
 * ever), a new producer does (a new producer id and epoch, sequences from zero). */
const RESET = new Set(['OUT_OF_ORDER_SEQUENCE_NUMBER', 'UNKNOWN_PRODUCER_ID', 'INVALID_PRODUCER_ID_MAPPING']);

function needsReset(error: unknown): boolean {
  return [...tree(error)].some((e) => e.apiId !== undefined && RESET.has(e.apiId));
}

/** The client's error in the seam's terms: `type` MESSAGE_TOO_LARGE or PRODUCER_FENCED, `retriable` for an
 * outage (a network error, a timeout, or a protocol error the client says can be retried). */
function mapped(error: unknown): Error {
  const all = [...tree(error)];
  const too = all.find((e) => e.apiId === 'MESSAGE_TOO_LARGE');
  const fenced = all.find((e) => e.apiId === 'INVALID_PRODUCER_EPOCH' || e.apiId === 'PRODUCER_FENCED');
  // a producer reset (needsReset) counts as an outage: the adapter replaces the producer, the worker retries
  const outage = all.some(
    (e) => e.canRetry === true || e.code === 'PLT_KFK_NETWORK' || e.code === 'PLT_KFK_TIMEOUT' || (e.apiId !== undefined && RESET.has(e.apiId)),
  );
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

/** Records in @platformatic/kafka's terms (keys and values as bytes, headers as a Map). */
function messagesOf(topic: string, records: OutRecord[]) {
  return records.map((r) => ({
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
  }));
}

/** The worker's client on @platformatic/kafka (both modes): `new AgentWorker(handler, { client:
 * platformaticClient, ... })`. */
export function platformaticClient(config: ClientConfig): KafkaClient {
  const base = connection(config);
  const newProducer = () =>
    new Producer({ ...base, idempotent: true, partitioner: compatibilityPartitioner } as never) as Producer<Buffer, Buffer, Buffer, Buffer>;
  let producer = newProducer();
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

  /** Set when the consumer lost its group membership for good (a rejoin that failed: the client then stops
   * heartbeating): the stream is closed and consumed again, which joins the group anew. */
  let lost = false;

  /** Reads the stream: one chain per partition (a record after the previous one's eachRecord), each bounded;
   * an eachRecord that rejects closes the stream (at once: the stream may have nothing more to deliver, and a
   * loop waiting on its next record would wait for ever) and consumes again from the committed offsets. */
  async function pump(options: ConsumeOptions): Promise<void> {
    while (!closing) {
      const chains = new Map<number, { tail: Promise<void>; queued: number }>();
      let failed: unknown;
      lost = false;
      try {
        stream = await consumer.consume({
          topics: [options.topic],
          mode: MessagesStreamModes.COMMITTED,
          fallbackMode: 'earliest',
          autocommit: false,
          isolationLevel: FetchIsolationLevels.READ_COMMITTED,
        } as never);
      } catch (error) {
        if (closing || !isOutage(mapped(error))) throw error;
        await new Promise((resolve) => setTimeout(resolve, OUTAGE_PAUSE_MS));
        continue;
      }
      if (lost) void stream.close().catch(() => undefined); // lost while joining: join again
      let outage = false;
      const current = stream;
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
              if (failed !== undefined) return;
              failed = error;
              void current.close().catch(() => undefined);
            })
            .finally(() => {
              chain.queued -= 1;
            });
          if (chain.queued >= QUEUED_PER_PARTITION) await chain.tail;
        }
      } catch (error) {
        // the stream gave up fetching (a broker frozen or stopped): an outage, waited out by reading again
        // from the committed offsets (the worker takes the redelivery as after an error); else a crash
        if (closing || !isOutage(mapped(error))) throw error;
        outage = true;
      } finally {
        await Promise.allSettled([...chains.values()].map((c) => c.tail));
        await current.close().catch(() => undefined);
      }
      if (outage || lost) {
        await new Promise((resolve) => setTimeout(resolve, OUTAGE_PAUSE_MS));
        continue;
      }
      if (failed === undefined) return;
    }
  }

  return {
    crashed,
    connect: async () => undefined,
    async consume(options) {
      // a rejoin the client gave up (its retries spent in an outage): no more heartbeats, the member is gone;
      // unlistened, this 'error' would be thrown (an EventEmitter's) and end the process
      consumer.on('error', () => {
        if (closing) return;
        lost = true;
        void stream?.close().catch(() => undefined);
      });
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
        const used = producer;
        try {
          await used.send({ acks: ProduceAcks.ALL, messages: messagesOf(topic, records) });
        } catch (error) {
          if (needsReset(error) && producer === used) {
            producer = newProducer(); // the worker sends again (an outage): on a new producer
            void used.close().catch(() => undefined);
          }
          throw error;
        }
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
    transactional(transactionalId): TransactionalProducer {
      // producerId/producerEpoch -1: InitProducerId as a new producer of the id (the client's default, 0/0,
      // is refused PRODUCER_FENCED once the id has a producer), fencing the previous holder and completing
      // its open transaction (the broker finishes a commit it received, aborts one it did not).
      const newTxProducer = () => new Producer({
        ...base,
        idempotent: true,
        transactionalId,
        retries: TX_RETRIES,
        retryDelay: txRetryDelay,
        producerId: -1n,
        producerEpoch: -1,
        partitioner: compatibilityPartitioner,
      } as never) as Producer<Buffer, Buffer, Buffer, Buffer>;
      let txProducer = newTxProducer();
      /** Set by an error that needs a new producer (needsReset): replaced before the next transaction (the
       * current one is still aborted on the old producer). Its InitProducerId fences the old one's epoch and
       * aborts a transaction it left open. */
      let reset = false;
      const noting = async <T>(fn: () => Promise<T>): Promise<T> => {
        try {
          return await fn();
        } catch (error) {
          if (needsReset(error)) reset = true;
          throw error;
        }
      };
      return {
        connect: async () => undefined, // InitProducerId comes with the first transaction (the worker opens one)
        disconnect: () => txProducer.close().catch(() => undefined),
        transaction: () =>
          guarded(async (): Promise<Tx> => {
            if (reset) {
              reset = false;
              const old = txProducer;
              txProducer = newTxProducer();
              await old.close().catch(() => undefined);
            }
            const txn = await noting(() => txProducer.beginTransaction());
            let touched = false; // EndTxn of an empty transaction is refused: it is only cancelled locally
            return {
              send: (record) =>
                guarded(async () => {
                  touched = true;
                  await noting(() => txn.send({ acks: ProduceAcks.ALL, messages: messagesOf(record.topic, record.messages as OutRecord[]) } as never));
                }),
              sendOffsets: ({ consumerGroupId, topics }) =>
                guarded(async () => {
                  touched = true;
                  await txn.addConsumer(consumer as never);
                  // the consumer forgets its coordinator on a network error (until its next group request):
                  // TxnOffsetCommit goes to the coordinator found again, not to no broker at all
                  const coordinatorId = consumer.coordinatorId ?? (await consumer.findGroupCoordinator());
                  for (const { topic, partitions } of topics) {
                    for (const { partition, offset } of partitions) {
                      // addOffset commits the message's offset + 1 with its group metadata: the consumer's now
                      const metadata = {
                        consumer: {
                          groupId: consumerGroupId,
                          generationId: consumer.generationId,
                          memberId: consumer.memberId,
                          coordinatorId,
                        },
                      };
                      await noting(() => txn.addOffset({ topic, partition, offset: BigInt(offset) - 1n, metadata } as never));
                    }
                  }
                }),
              commit: () => guarded(async () => void (await noting(() => txn.commit()))),
              abort: () => guarded(async () => void (await (touched ? txn.abort() : txn.cancel()))),
            };
          }),
      };
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
