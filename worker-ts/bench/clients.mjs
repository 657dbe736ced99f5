// The Kafka client choice, measured on a real broker (not part of the package; run from worker-ts/ on Node 22):
//   node bench/clients.mjs partitions BOOTSTRAP TOPIC N   keyed records `thread-<i>` through each of the package's
//                                                          adapters (dist/esm: kafkajsClient, platformaticClient:
//                                                          what the worker sends with), for the partitioner test
//                                                          (tests/interop/test_worker_ts_clients.py)
//   node bench/clients.mjs bench BOOTSTRAP TOPIC N        N records of 2 KiB through each client: produce
//                                                          (acks all, batches of 100), consume them back in a
//                                                          consumer group, and 200 one-at-a-time sends (latency)
//   node bench/clients.mjs turns BOOTSTRAP PREFIX N [ROUNDS] the AgentWorker itself (dist/esm: `npm run build`) on
//                                                          each client, alternating, ROUNDS times (default 2): N
//                                                          enriched requests (200 threads) on a topic of 6
//                                                          partitions, an immediate handler; turns/s from run()
//                                                          to the N-th answer, CPU-ms per turn (process.cpuUsage)
// One JSON line per client (per round) on stdout.
import { randomUUID } from 'node:crypto';

import {
  compatibilityPartitioner,
  Consumer,
  MessagesStreamModes,
  ProduceAcks,
  Producer,
  stringDeserializers,
  stringSerializers,
} from '@platformatic/kafka';
import { Kafka, logLevel, Partitioners } from 'kafkajs';

const [mode, bootstrap, topic, count, rounds] = process.argv.slice(2);
const n = Number(count ?? '1000');
const value = 'x'.repeat(2048);
const keys = Array.from({ length: n }, (_, i) => `thread-${i}`);
const say = (line) => process.stdout.write(JSON.stringify(line) + '\n');
const percentile = (sorted, p) => sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];

function kafkajs() {
  const kafka = new Kafka({ clientId: 'bench', brokers: [bootstrap], logLevel: logLevel.NOTHING });
  const producer = kafka.producer({ idempotent: true, createPartitioner: Partitioners.DefaultPartitioner });
  return {
    name: 'kafkajs',
    connect: () => producer.connect(),
    send: (batch) =>
      producer.send({ topic, acks: -1, messages: batch.map((key) => ({ key, value: mode === 'bench' ? value : key })) }),
    close: () => producer.disconnect(),
    async consume(total) {
      const consumer = kafka.consumer({ groupId: `bench-${randomUUID()}` });
      await consumer.connect();
      await consumer.subscribe({ topics: [topic], fromBeginning: true });
      let seen = 0;
      await new Promise((resolve) => {
        void consumer.run({
          eachMessage: async () => {
            seen += 1;
            if (seen >= total) resolve();
          },
        });
      });
      await consumer.disconnect();
    },
  };
}

function platformatic() {
  const producer = new Producer({
    clientId: 'bench',
    bootstrapBrokers: [bootstrap],
    serializers: stringSerializers,
    partitioner: compatibilityPartitioner, // Java's murmur2 (the default one differs: another partition for half the keys)
    idempotent: true,
  });
  return {
    name: '@platformatic/kafka',
    connect: async () => undefined,
    send: (batch) =>
      producer.send({ acks: ProduceAcks.ALL, messages: batch.map((key) => ({ topic, key, value: mode === 'bench' ? value : key })) }),
    close: () => producer.close(),
    async consume(total) {
      const consumer = new Consumer({
        clientId: 'bench',
        groupId: `bench-${randomUUID()}`,
        bootstrapBrokers: [bootstrap],
        deserializers: stringDeserializers,
      });
      const stream = await consumer.consume({ topics: [topic], mode: MessagesStreamModes.EARLIEST, autocommit: false });
      let seen = 0;
      for await (const _ of stream) {
        seen += 1;
        if (seen >= total) break;
      }
      await stream.close();
      await consumer.close();
    },
  };
}

async function produceAll(client, list) {
  for (let i = 0; i < list.length; i += 100) await client.send(list.slice(i, i + 100));
}

async function turns() {
  const { AgentWorker } = await import('../dist/esm/index.js');
  const { kafkajsClient } = await import('../dist/esm/kafkajs.js');
  const { platformaticClient } = await import('../dist/esm/platformatic.js');
  const { enrichedRequest } = await import('../dist/esm/testing.js');
  const kafka = new Kafka({ clientId: 'bench', brokers: [bootstrap], logLevel: logLevel.NOTHING });
  const admin = kafka.admin();
  await admin.connect();
  const enriched = `${topic}-enriched`;
  const topics = [enriched];
  const clients = { kafkajs: kafkajsClient, '@platformatic/kafka': platformaticClient };
  const order = [];
  for (let r = 0; r < Number(rounds ?? '2'); r += 1) order.push(...(r % 2 === 0 ? Object.keys(clients) : Object.keys(clients).reverse()));
  order.forEach((_, i) => topics.push(`${topic}-responses-${i}`));
  await admin.createTopics({ topics: topics.map((t) => ({ topic: t, numPartitions: 6, replicationFactor: 1 })) });
  await admin.disconnect();
  const producer = kafka.producer({ idempotent: true, createPartitioner: Partitioners.DefaultPartitioner });
  await producer.connect();
  const requests = Array.from({ length: n }, (_, i) => enrichedRequest({ requestId: `r-${i}`, threadId: `thread-${i % 200}`, text: `turn ${i}` }));
  for (let i = 0; i < n; i += 500) {
    await producer.send({ topic: enriched, acks: -1, messages: requests.slice(i, i + 500).map((e) => ({ key: e.threadId, value: JSON.stringify(e) })) });
  }
  await producer.disconnect();
  for (const [i, name] of order.entries()) {
    const worker = new AgentWorker(async (turn) => `re: ${turn.requestId}`, {
      brokers: [bootstrap],
      groupId: `${topic}-${i}`,
      enrichedTopic: enriched,
      responsesTopic: `${topic}-responses-${i}`,
      client: clients[name],
      readBackPerPartition: 0,
      tracing: false,
      handleSignals: false,
      logger: () => undefined,
    });
    let answered = 0;
    let finished;
    const all = new Promise((resolve) => {
      finished = resolve;
    });
    worker.on('answered', () => {
      answered += 1;
      if (answered === n) finished();
    });
    const cpu = process.cpuUsage();
    const started = performance.now();
    const running = worker.run();
    await all;
    const ms = performance.now() - started;
    const used = process.cpuUsage(cpu);
    await worker.stop();
    await running;
    say({ client: name, round: Math.floor(i / 2) + 1, turns: n, turnsPerS: Math.round((n / ms) * 1000), cpuMsPerTurn: Number(((used.user + used.system) / 1000 / n).toFixed(3)) });
  }
}

async function adapters() {
  const { kafkajsClient } = await import('../dist/esm/kafkajs.js');
  const { platformaticClient } = await import('../dist/esm/platformatic.js');
  for (const [name, factory] of [['kafkajs', kafkajsClient], ['@platformatic/kafka', platformaticClient]]) {
    const client = factory({ brokers: [bootstrap], clientId: 'bench', groupId: `bench-${randomUUID()}` });
    await client.connect();
    for (let i = 0; i < keys.length; i += 100) await client.send(topic, keys.slice(i, i + 100).map((key) => ({ key, value: key })));
    await client.close();
    say({ client: name, produced: n });
  }
}

if (mode === 'turns') {
  await turns();
  process.exit(0);
}
if (mode === 'partitions') {
  await adapters();
  process.exit(0);
}

for (const client of [kafkajs(), platformatic()]) {
  await client.connect();
  if (mode === 'partitions') {
    await produceAll(client, keys);
    say({ client: client.name, produced: n });
  } else {
    const started = performance.now();
    await produceAll(client, keys);
    const produceMs = performance.now() - started;
    const latencies = [];
    for (let i = 0; i < 200; i += 1) {
      const t = performance.now();
      await client.send([keys[i]]);
      latencies.push(performance.now() - t);
    }
    latencies.sort((a, b) => a - b);
    // everything on the topic so far: both clients' records when it is the second one
    const total = client.name === 'kafkajs' ? n + 200 : 2 * (n + 200);
    const consumeStarted = performance.now();
    await client.consume(total);
    const consumeMs = performance.now() - consumeStarted;
    say({
      client: client.name,
      records: n,
      produceRecordsPerS: Math.round((n / produceMs) * 1000),
      sendAckP50Ms: Number(percentile(latencies, 50).toFixed(2)),
      sendAckP99Ms: Number(percentile(latencies, 99).toFixed(2)),
      consumed: total,
      consumeRecordsPerS: Math.round((total / consumeMs) * 1000),
    });
  }
  await client.close();
}
