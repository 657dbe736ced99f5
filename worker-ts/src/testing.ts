// `@message-history/worker/testing`: unit tests of a handler without Kafka. A fixture builder for enriched
// requests, a text helper, and a harness that runs turns through the same code as the worker (the turn's
// signal, the handler timeout, the reply check, the AgentResponse or the failed turn with its reason), one
// thread's turns in order, threads at the same time.
import type { AgentResponse, EnrichedMessage, EnrichedRequest, ResponseMessage } from './events.js';
import { respond, type Handler } from './respond.js';
import { SeenEvents, Turn } from './turn.js';

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
 * Feeds enriched requests to a handler as the worker would and collects the responses it would send. One
 * thread's turns run one after the other in the order given, different threads at the same time.
 */
export class TestHarness {
  readonly results: HarnessResult[] = [];
  /** eventIds dropped as already answered (the worker's SeenEvents: a copy is answered once). */
  readonly duplicates: string[] = [];
  private readonly threads = new Map<string, Promise<unknown>>();
  private readonly seen = new SeenEvents();

  constructor(
    private readonly handler: Handler,
    private readonly options: HarnessOptions = {},
  ) {}

  /** Runs the requests (or fixtures) and resolves with their results, in the order given; a request whose
   * eventId was answered already is dropped, as the worker drops it (no result, listed in `duplicates`). */
  async send(...requests: (EnrichedRequest | EnrichedRequestFixture)[]): Promise<HarnessResult[]> {
    const events = requests.map((r) => ('schemaVersion' in r ? r : enrichedRequest(r)));
    const fresh = events.filter((event) => {
      if (this.seen.has(0, event.eventId)) {
        this.duplicates.push(event.eventId);
        return false;
      }
      this.seen.add(0, event.eventId);
      return true;
    });
    return Promise.all(
      fresh.map((event, i) => {
        const previous = this.threads.get(event.threadId) ?? Promise.resolve();
        const next = previous.then(async () => {
          let retries = 0;
          const { turn, outcome } = await respond(this.handler, (signal) => new Turn(event, 0, String(i), signal), {
            timeoutMs: this.options.handlerTimeoutMs,
            retryInitialMs: this.options.retryInitialMs ?? 1,
            retryMaxMs: this.options.retryMaxMs ?? 1,
            onRetry: () => {
              retries += 1;
            },
          });
          if (outcome.kind === 'gave-up') throw new Error('unreachable: the harness never gives a turn up');
          const result: HarnessResult = { turn, response: outcome.response, retries };
          if (outcome.kind === 'failed') result.failure = outcome.failure;
          this.results.push(result);
          return result;
        });
        this.threads.set(event.threadId, next.catch(() => undefined));
        return next;
      }),
    );
  }

  /** The responses sent so far, in the order they were. */
  get responses(): AgentResponse[] {
    return this.results.map((r) => r.response);
  }
}
