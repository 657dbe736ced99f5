// The KafkaJS 2.2.4 adapter of the client seam (src/client.ts): `kafkajsClient`, no longer the worker's default
// (the ObserverWorker's still). Under at-least-once a send that times out can lose an acknowledged answer (see
// the README's client note). The only file that imports kafkajs.
import { randomUUID } from 'node:crypto';

import { Kafka, logLevel, Partitioners, type Consumer, type KafkaConfig, type Producer } from 'kafkajs';

import type { ClientConfig, KafkaClient, PartitionOffsets, TransactionalProducer } from './client.js';
import type { ConnectionOptions } from './settings.js';

/** The package's TLS and SASL settings as KafkaJS takes them. */
function kafkajsSecurity(options: ConnectionOptions): Pick<KafkaConfig, 'ssl' | 'sasl'> {
  const out: Pick<KafkaConfig, 'ssl' | 'sasl'> = {};
  if (options.ssl !== undefined) out.ssl = options.ssl;
  if (options.sasl !== undefined) out.sasl = { ...options.sasl } as KafkaConfig['sasl'];
  return out;
}

/** The worker's client on KafkaJS: an idempotent producer with the Java-compatible (murmur2) partitioner, a
 * read_committed consumer in the worker's group, an admin for offsets, a throwaway group for the read-back. */
export function kafkajsClient(config: ClientConfig): KafkaClient {
  const kafka = new Kafka({
    logLevel: logLevel.WARN,
    clientId: config.clientId,
    brokers: config.brokers,
    ...kafkajsSecurity(config),
    ...(config.requestTimeoutMs === undefined ? {} : { requestTimeout: config.requestTimeoutMs }),
  });
  // The Java-compatible (murmur2) partitioner, as the service's: a thread's records share a partition.
  const producer: Producer = kafka.producer({ idempotent: true, createPartitioner: Partitioners.DefaultPartitioner });
  // Committed records only: under exactly-once the service's aborted outputs are never answered.
  const consumer: Consumer = kafka.consumer({
    groupId: config.groupId,
    readUncommitted: false,
    ...(config.sessionTimeoutMs === undefined ? {} : { sessionTimeout: config.sessionTimeoutMs }),
    ...(config.heartbeatIntervalMs === undefined ? {} : { heartbeatInterval: config.heartbeatIntervalMs }),
  });
  const crashed = new Promise<never>((_, reject) => {
    consumer.on(consumer.events.CRASH, (event) => {
      if (!event.payload.restart) reject(event.payload.error);
    });
  });
  crashed.catch(() => undefined); // the worker observes it; never an unhandled rejection

  async function withAdmin<T>(fn: (admin: ReturnType<Kafka['admin']>) => Promise<T>): Promise<T> {
    const admin = kafka.admin();
    await admin.connect();
    try {
      return await fn(admin);
    } finally {
      await admin.disconnect().catch(() => undefined);
    }
  }

  return {
    crashed,
    connect: () => producer.connect(),
    async consume({ topic, onAssignment, eachRecord, partitionsConcurrently }) {
      consumer.on(consumer.events.GROUP_JOIN, (event) => {
        onAssignment(event.payload.memberAssignment[topic] ?? []);
      });
      await consumer.connect();
      await consumer.subscribe({ topics: [topic], fromBeginning: true });
      await consumer.run({
        autoCommit: false,
        partitionsConsumedConcurrently: partitionsConcurrently,
        eachMessage: async ({ partition, message, heartbeat }) => {
          const headers = message.headers as Record<string, Buffer | string | (Buffer | string)[] | undefined> | undefined;
          await eachRecord({ topic, partition, offset: message.offset, value: message.value, ...(headers ? { headers } : {}) }, heartbeat);
        },
      });
    },
    async send(topic, records) {
      await producer.send({ topic, acks: -1, messages: records });
    },
    async commit(topic, partition, next) {
      await consumer.commitOffsets([{ topic, partition, offset: next.toString() }]);
    },
    committed: (topic) =>
      withAdmin(async (admin) => {
        const [found] = await admin.fetchOffsets({ groupId: config.groupId, topics: [topic] });
        const out = new Map<number, bigint>();
        for (const { partition, offset } of found?.partitions ?? []) if (BigInt(offset) >= 0n) out.set(partition, BigInt(offset));
        return out;
      }),
    offsets: (topic) =>
      withAdmin(async (admin): Promise<PartitionOffsets[]> =>
        (await admin.fetchTopicOffsets(topic)).map((o) => ({ partition: o.partition, low: BigInt(o.low), high: BigInt(o.high) })),
      ),
    async readRange(topic, ranges, each, timeoutMs) {
      // A throwaway group (KafkaJS has no manual assignment), deleted afterwards.
      const groupId = `${config.groupId}.read-back.${randomUUID()}`;
      const reader = kafka.consumer({ groupId });
      const remaining = new Set(ranges.keys());
      let finished!: () => void;
      const done = new Promise<void>((resolve) => {
        finished = resolve;
      });
      try {
        await reader.connect();
        await reader.subscribe({ topics: [topic], fromBeginning: true });
        await reader.run({
          autoCommit: false,
          eachBatch: async ({ batch }) => {
            const target = ranges.get(batch.partition);
            if (target === undefined) return;
            for (const message of batch.messages) {
              const offset = BigInt(message.offset);
              if (offset >= target.start && offset < target.end) each(batch.partition, message.value);
            }
            if (BigInt(batch.lastOffset()) >= target.end - 1n) {
              remaining.delete(batch.partition);
              if (remaining.size === 0) finished();
            }
          },
        });
        for (const [partition, { start }] of ranges) reader.seek({ topic, partition, offset: start.toString() });
        let timer: NodeJS.Timeout | undefined;
        const late = new Promise<void>((resolve) => {
          timer = setTimeout(resolve, timeoutMs);
        });
        await Promise.race([done, late]);
        clearTimeout(timer);
        return [...remaining];
      } finally {
        await reader.disconnect().catch(() => undefined);
        await withAdmin((admin) => admin.deleteGroups([groupId])).catch(() => undefined);
      }
    },
    transactional(transactionalId): TransactionalProducer {
      return kafka.producer({
        transactionalId,
        idempotent: true,
        maxInFlightRequests: 1,
        createPartitioner: Partitioners.DefaultPartitioner,
      }) as unknown as TransactionalProducer;
    },
    leave: () => consumer.disconnect(),
    close: () => producer.disconnect(),
  };
}
