// A Mastra agent as a message-history worker: EnrichedRequest in (agent.requests.enriched), AgentResponse out
// (agent.responses). The service recalls the thread's history into each request and saves each response, so
// the agent runs WITHOUT Mastra `memory`: with memory on as well, every turn would be recalled and saved twice.
//
//   KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 node dist/worker.js
//
// Environment: KAFKA_BOOTSTRAP_SERVERS, MESSAGE_HISTORY_ENRICHED_TOPIC, MESSAGE_HISTORY_RESPONSES_TOPIC (the
// service's names and defaults), WORKER_GROUP_ID (default `mastra-agent-worker`). One JSON line per turn on
// stdout. What it does, as the Python worker SDK does (docs/worker.md):
//   - per partition one turn at a time (a thread is on one partition, so its turns stay in order);
//   - the response echoes requestId/threadId/resourceId/metadata, puts the context it was given in `input`
//     (each message keeps its `source`, so recalled ones are not saved again) and the agent's new messages in
//     `response` (without id/createdAt: the service derives them from the requestId, so a redelivered turn
//     is stored once);
//   - an agent that throws answers a failed turn: finishReason "error", no response (the service saves none
//     of it);
//   - the offset is committed after Kafka acknowledged the response (at-least-once), and an eventId already
//     answered on the partition (the last 10,000) is skipped;
//   - headers are passed on (W3C `traceparent` included); SIGTERM/SIGINT finish the turn in flight and leave.
import { Agent } from '@mastra/core/agent';
import { Kafka, logLevel, Partitioners, type IHeaders } from 'kafkajs';

import { prompts, stubModel } from './stub-model.js';

type Source = 'memory' | 'input';
interface EnrichedMessage {
  id: string;
  role: string;
  createdAt: string;
  source: Source;
  [field: string]: unknown;
}
interface EnrichedRequest {
  schemaVersion: 1;
  requestId: string;
  eventId: string;
  threadId: string;
  resourceId: string;
  createdAt: string;
  metadata?: Record<string, unknown> | null;
  memory?: { readOnly?: boolean | null } | null;
  history: { recalled: number; limit: number | null };
  messages: EnrichedMessage[];
}

const env = (name: string, fallback: string): string => process.env[name] || fallback;
const config = {
  brokers: env('KAFKA_BOOTSTRAP_SERVERS', '127.0.0.1:9092').split(','),
  enrichedTopic: env('MESSAGE_HISTORY_ENRICHED_TOPIC', 'agent.requests.enriched'),
  responsesTopic: env('MESSAGE_HISTORY_RESPONSES_TOPIC', 'agent.responses'),
  groupId: env('WORKER_GROUP_ID', 'mastra-agent-worker'),
};
const SEEN_PER_PARTITION = 10_000;

const say = (line: Record<string, unknown>): void => {
  process.stdout.write(JSON.stringify(line) + '\n');
};

// No `memory` here, on purpose (see the top of this file).
const agent = new Agent({
  id: 'assistant',
  name: 'assistant',
  instructions: 'You are a helpful assistant. Answer briefly.',
  model: stubModel,
});

/** Never before the context's newest message, so the answer sorts after its question whatever the clocks. */
function responseTime(event: EnrichedRequest): string {
  const newest = Math.max(0, ...event.messages.map((m) => Date.parse(m.createdAt) + 1));
  return new Date(Math.max(Date.now(), newest)).toISOString();
}

async function answer(event: EnrichedRequest): Promise<Record<string, unknown>> {
  const given = new Set(event.messages.map((m) => m.id));
  let response: Record<string, unknown>[] = [];
  let finishReason = 'stop';
  try {
    const result = await agent.generate(
      event.messages.map(({ source: _source, ...message }) => ({
        ...message,
        createdAt: new Date(message.createdAt),
      })) as Parameters<typeof agent.generate>[0],
    );
    finishReason = result.finishReason ?? 'stop';
    // `result.messages` is the whole list in Mastra's stored shape (MastraDBMessage); the new ones are ours.
    response = result.messages
      .filter((m) => !given.has(m.id))
      .map(({ id: _id, createdAt: _createdAt, ...message }) => message as Record<string, unknown>);
  } catch (error) {
    say({ event: 'failed', requestId: event.requestId, error: String(error) });
    finishReason = 'error';
    response = [];
  }
  const out: Record<string, unknown> = {
    schemaVersion: 1,
    requestId: event.requestId,
    threadId: event.threadId,
    resourceId: event.resourceId,
    createdAt: responseTime(event),
    input: event.messages,
    response,
    finishReason,
  };
  if (event.metadata != null) out.metadata = event.metadata;
  if (event.memory?.readOnly != null) out.memory = { readOnly: event.memory.readOnly };
  return out;
}

class SeenEvents {
  private readonly seen = new Map<number, Map<string, true>>();

  has(partition: number, eventId: string): boolean {
    return this.seen.get(partition)?.has(eventId) ?? false;
  }

  add(partition: number, eventId: string): void {
    const ids = this.seen.get(partition) ?? new Map<string, true>();
    this.seen.set(partition, ids);
    ids.delete(eventId);
    ids.set(eventId, true);
    if (ids.size > SEEN_PER_PARTITION) ids.delete(ids.keys().next().value as string);
  }
}

async function main(): Promise<void> {
  const kafka = new Kafka({ clientId: config.groupId, brokers: config.brokers, logLevel: logLevel.WARN });
  // The Java-compatible (murmur2) partitioner, as the service uses: a thread's records share a partition.
  const producer = kafka.producer({ idempotent: true, createPartitioner: Partitioners.DefaultPartitioner });
  const consumer = kafka.consumer({ groupId: config.groupId });
  const seen = new SeenEvents();
  await producer.connect();
  await consumer.connect();
  await consumer.subscribe({ topics: [config.enrichedTopic], fromBeginning: true });

  let stopping = false;
  const stop = async (signal: string): Promise<void> => {
    if (stopping) return;
    stopping = true;
    say({ event: 'stopping', signal });
    await consumer.disconnect(); // waits for the turn in flight, then leaves the group
    await producer.disconnect();
    say({ event: 'stopped', prompts: prompts.length });
    process.exit(0);
  };
  process.on('SIGTERM', () => void stop('SIGTERM'));
  process.on('SIGINT', () => void stop('SIGINT'));

  await consumer.run({
    autoCommit: false,
    partitionsConsumedConcurrently: 4,
    eachMessage: async ({ topic, partition, message }) => {
      const next = [{ topic, partition, offset: (BigInt(message.offset) + 1n).toString() }];
      let event: EnrichedRequest;
      try {
        event = JSON.parse(message.value?.toString('utf8') ?? '') as EnrichedRequest;
      } catch {
        say({ event: 'invalid', partition, offset: message.offset });
        await consumer.commitOffsets(next);
        return;
      }
      if (seen.has(partition, event.eventId)) {
        say({ event: 'duplicate', requestId: event.requestId, eventId: event.eventId });
        await consumer.commitOffsets(next);
        return;
      }
      const response = await answer(event);
      await producer.send({
        topic: config.responsesTopic,
        acks: -1,
        messages: [
          { key: event.threadId, value: JSON.stringify(response), headers: message.headers as IHeaders },
        ],
      });
      await consumer.commitOffsets(next);
      seen.add(partition, event.eventId);
      say({
        event: 'answered',
        requestId: event.requestId,
        recalled: event.history.recalled,
        promptMessages: prompts.at(-1)?.length ?? 0,
        finishReason: response.finishReason,
      });
    },
  });
  say({ event: 'ready', topic: config.enrichedTopic, groupId: config.groupId });
}

main().catch((error: unknown) => {
  console.error(error);
  process.exit(1);
});
