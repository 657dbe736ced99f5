// `@message-history/worker/testing`: unit tests of a handler without Kafka. A fixture builder for enriched
// requests, a text helper, and a harness that runs turns through the same code as the worker (the turn's
// signal, the handler timeout, the reply check, the AgentResponse or the failed turn with its reason), one
// thread's turns in order, threads at the same time.
import type { AgentResponse, EnrichedMessage, EnrichedRequest, ResponseMessage } from './events.js';
import { MemoryKafka, memoryClient } from './memory.js';
import type { Handler } from './respond.js';
import type { Turn } from './turn.js';
import { AgentWorker } from './worker.js';

export interface FixtureMessage {
  role: 'user' | 'assistant' | 'system';
  text: string;
}

export interface EnrichedRequestFixture {
  requestId?: string;
  threadId?: string;
  resourceId?: string;
  /** The turn's own message (a user message; `input` for several). */
  text?: string;
  input?: FixtureMessage[];
  /** The recalled history, oldest first. */
  history?: FixtureMessage[];
  metadata?: Record<string, unknown>;
  readOnly?: boolean;
  /** The request's createdAt (default now); the messages are 1 ms apart before it. */
  createdAt?: Date;
}

let fixtureCount = 0;

/** A valid EnrichedRequest, as the service writes one: history (`source: "memory"`) then input. */
export function enrichedRequest(fixture: EnrichedRequestFixture = {}): EnrichedRequest {
  fixtureCount += 1;
  const requestId = fixture.requestId ?? `request-${fixtureCount}`;
  const threadId = fixture.threadId ?? 'thread-1';
  const resourceId = fixture.resourceId ?? 'resource-1';
  const at = fixture.createdAt ?? new Date();
  const history = fixture.history ?? [];
  const input = fixture.input ?? [{ role: 'user', text: fixture.text ?? 'hello' }];
  const all = [...history.map((m) => ({ ...m, source: 'memory' as const })), ...input.map((m) => ({ ...m, source: 'input' as const }))];
  const messages: EnrichedMessage[] = all.map((m, i) => ({
    id: m.source === 'memory' ? `${threadId}:history:${i}` : `${requestId}:input:${i - history.length}`,
    role: m.role,
    createdAt: new Date(at.getTime() - (all.length - i)).toISOString(),
    threadId,
    resourceId,
    type: 'v2',
    content: { format: 2, parts: [{ type: 'text', text: m.text }] },
    source: m.source,
  }));
  const event: EnrichedRequest = {
    schemaVersion: 1,
    requestId,
    eventId: requestId,
    threadId,
    resourceId,
    createdAt: at.toISOString(),
    history: { recalled: history.length, limit: 40 },
    messages,
  };
  if (fixture.metadata !== undefined) event.metadata = fixture.metadata;
  if (fixture.readOnly !== undefined) event.memory = { readOnly: fixture.readOnly };
  return event;
}

/** The text of a message (its text parts joined), or of an AgentResponse's messages (joined by newlines). */
export function text(of: ResponseMessage | EnrichedMessage | AgentResponse): string {
  if ('response' in of && Array.isArray(of.response)) return of.response.map((m) => text(m)).join('\n');
  const content = (of as ResponseMessage).content;
  if (typeof content === 'string') return content;
  const parts = (content as { parts?: { type?: string; text?: string }[] } | null)?.parts ?? [];
  return parts
    .filter((p) => p.type === 'text')
    .map((p) => p.text ?? '')
    .join(' ');
}

export interface HarnessOptions {
  /** As the worker's: the turn's signal is aborted and the turn failed after this long. */
  handlerTimeoutMs?: number;
  /** The backoff before redoing a RetryLater turn (default 1 ms here, so tests do not wait). */
  retryInitialMs?: number;
  retryMaxMs?: number;
  /** Partitions of the in-memory topics (default 1). */
  partitions?: number;
  /** Threads with turns in flight per partition (the worker's `maxConcurrentTurnsPerPartition`, default 32). */
  maxConcurrentTurnsPerPartition?: number;
  /** Records read and not done per partition (the worker's `maxPendingRecordsPerPartition`, default 100). */
  maxPendingRecordsPerPartition?: number;
  /** The in-memory broker's record size limit (default 1 MiB): a larger reply is a failed turn. */
  maxRecordBytes?: number;
  processingGuarantee?: 'at-least-once' | 'exactly-once';
}

/** A turn the harness answered: the response sent, and for a failed turn why (what the worker logs). */
export interface HarnessResult {
  turn: Turn;
  response: AgentResponse;
  failure?: string;
  /** How many times the handler asked to retry later before this answer. */
  retries: number;
}

/**
 * The real AgentWorker on an in-memory Kafka (`MemoryKafka`, `memoryClient`): requests are written keyed by
 * their threadId (Java's murmur2, as the service) to the enriched topic, the worker answers them as on a
 * broker (one thread's turns in order, threads at the same time, up to 32 per partition; failed turns, retry
 * later, duplicates, oversized replies) and the responses are collected from the responses topic.
 */
export class TestHarness {
  readonly results: HarnessResult[] = [];
  /** eventIds dropped as already answered (the worker's SeenEvents: a copy is answered once). */
  readonly duplicates: string[] = [];
  /** What the worker logged. */
  readonly logs: { level: string; message: string; fields?: Record<string, unknown> }[] = [];
  readonly broker: MemoryKafka;
  readonly worker: AgentWorker;
  private running: Promise<unknown> | undefined;
  private readonly waiting = new Map<string, ((result: HarnessResult | undefined) => void)[]>();
  private readonly retries = new Map<string, number>();

  constructor(handler: Handler, options: HarnessOptions = {}) {
    this.broker = new MemoryKafka(options.partitions ?? 1, options.maxRecordBytes);
    this.broker.createTopic('agent.requests.enriched', options.partitions ?? 1);
    this.broker.createTopic('agent.responses', options.partitions ?? 1);
    this.worker = new AgentWorker(handler, {
      brokers: ['memory'],
      groupId: 'test-harness',
      client: memoryClient(this.broker),
      handleSignals: false,
      tracing: false,
      readBackPerPartition: 0,
      retryLaterInitialMs: options.retryInitialMs ?? 1,
      retryLaterMaxMs: options.retryMaxMs ?? 1,
      ...(options.handlerTimeoutMs === undefined ? {} : { handlerTimeoutMs: options.handlerTimeoutMs }),
      ...(options.maxConcurrentTurnsPerPartition === undefined ? {} : { maxConcurrentTurnsPerPartition: options.maxConcurrentTurnsPerPartition }),
      ...(options.maxPendingRecordsPerPartition === undefined ? {} : { maxPendingRecordsPerPartition: options.maxPendingRecordsPerPartition }),
      ...(options.processingGuarantee === undefined ? {} : { processingGuarantee: options.processingGuarantee }),
      logger: (level, message, fields) => {
        this.logs.push(fields === undefined ? { level, message } : { level, message, fields });
      },
    });
    this.worker.on('retrying', ({ requestId }) => this.retries.set(requestId, (this.retries.get(requestId) ?? 0) + 1));
    this.worker.on('answered', ({ turn, response }) => this.finish(turn.eventId, { turn, response, retries: this.retries.get(turn.requestId) ?? 0 }));
    this.worker.on('failed', ({ turn, response, failure }) =>
      this.finish(turn.eventId, { turn, response, failure, retries: this.retries.get(turn.requestId) ?? 0 }),
    );
    this.worker.on('dropped', ({ turn }) => this.resolve(turn.eventId, undefined));
    this.worker.on('duplicate', ({ eventId }) => {
      this.duplicates.push(eventId);
      this.resolve(eventId, undefined);
    });
  }

  /** Writes the requests (or fixtures) to the enriched topic and resolves with their results, in the order
   * given; a request whose eventId was answered already is dropped, as the worker drops it (no result, listed
   * in `duplicates`). */
  async send(...requests: (EnrichedRequest | EnrichedRequestFixture)[]): Promise<HarnessResult[]> {
    const events = requests.map((r) => ('schemaVersion' in r ? r : enrichedRequest(r)));
    const answers = events.map(
      (event) =>
        new Promise<HarnessResult | undefined>((resolve) => {
          const list = this.waiting.get(event.eventId) ?? [];
          list.push(resolve);
          this.waiting.set(event.eventId, list);
        }),
    );
    this.running ??= this.worker.run();
    this.broker.append(
      this.worker.enrichedTopic,
      events.map((event) => ({ key: event.threadId, value: JSON.stringify(event) })),
    );
    const results = await Promise.race([
      Promise.all(answers),
      this.running.then(() => {
        throw new Error('the worker stopped before answering');
      }),
    ]);
    return results.filter((r): r is HarnessResult => r !== undefined);
  }

  /** The responses sent so far, as the responses topic holds them. */
  get responses(): AgentResponse[] {
    return this.broker.records(this.worker.responsesTopic).map((r) => JSON.parse(r.value?.toString('utf8') ?? 'null') as AgentResponse);
  }

  /** Stops the worker (the turns in flight finish first). */
  async close(): Promise<void> {
    if (this.running !== undefined) await this.worker.stop();
  }

  private finish(eventId: string, result: HarnessResult): void {
    this.results.push(result);
    this.resolve(eventId, result);
  }

  private resolve(eventId: string, result: HarnessResult | undefined): void {
    const list = this.waiting.get(eventId);
    const next = list?.shift();
    if (list?.length === 0) this.waiting.delete(eventId);
    next?.(result);
  }
}

export { javaPartition, MemoryKafka, memoryClient, murmur2 } from './memory.js';
