// What a handler gets (Turn) and gives back (Reply), the AgentResponse built from them, and the bounded memory
// of answered eventIds. Pure: no Kafka. The same rules as the Python SDK's worker/turn.py (docs/worker.md).
import type { AgentResponse, EnrichedMessage, EnrichedRequest, HistoryInfo, ResponseMessage } from './events.js';

/** The finishReason of a failed turn: the service saves nothing of it (no user message left unanswered). */
export const FAILED = 'error';
export const DEFAULT_SEEN_PER_PARTITION = 10_000;

/** One enriched request as the handler sees it: the context to give the model, and the turn's ids. */
export class Turn {
  constructor(
    readonly event: EnrichedRequest,
    readonly partition = 0,
    readonly offset = '0',
    /** Aborted when the worker gives up on the turn (shutdown grace or handler timeout over). */
    readonly signal: AbortSignal = new AbortController().signal,
  ) {}

  get requestId(): string {
    return this.event.requestId;
  }
  get eventId(): string {
    return this.event.eventId;
  }
  get threadId(): string {
    return this.event.threadId;
  }
  get resourceId(): string {
    return this.event.resourceId;
  }
  get metadata(): Record<string, unknown> | null | undefined {
    return this.event.metadata;
  }
  get history(): HistoryInfo {
    return this.event.history;
  }
  /** The whole context, oldest first: the recalled history, then the turn's input (each with `source`). */
  get messages(): EnrichedMessage[] {
    return this.event.messages;
  }
  /** The recalled history (`source: "memory"`). */
  get memory(): EnrichedMessage[] {
    return this.event.messages.filter((m) => m.source === 'memory');
  }
  /** The turn's own messages (`source: "input"`). */
  get input(): EnrichedMessage[] {
    return this.event.messages.filter((m) => m.source === 'input');
  }
  /** The request asked that nothing of this turn be saved. */
  get readOnly(): boolean {
    return Boolean(this.event.memory?.readOnly);
  }
}

/** What a handler returns (a plain string is one assistant text message). */
export interface Reply {
  messages: ResponseMessage[];
  /** Default "stop"; null leaves the field out. */
  finishReason?: string | null;
  /** Default: the request's `memory.readOnly`. */
  readOnly?: boolean;
  /** Default: the request's metadata. */
  metadata?: Record<string, unknown>;
}

/** A format-2 assistant message holding `text` (id and createdAt are derived by the service). */
export function assistantText(text: string): ResponseMessage {
  return { role: 'assistant', content: { format: 2, parts: [{ type: 'text', text }] } };
}

export function textReply(text: string, finishReason: string | null = 'stop'): Reply {
  return { messages: [assistantText(text)], finishReason };
}

/** Why a reply's messages cannot be sent, or undefined (each must be an object with a role and a content). */
export function replyProblem(reply: Reply): string | undefined {
  if (!Array.isArray(reply.messages)) return 'messages is not a list';
  for (const [i, m] of reply.messages.entries()) {
    if (typeof m !== 'object' || m === null) return `response[${i}] is not an object`;
    if (typeof m.role !== 'string' || (m.role as string) === '') return `response[${i}] has no role`;
    if (m.content === undefined || m.content === null) return `response[${i}] has no content`;
  }
  return undefined;
}

/** The AgentResponse answering `turn` with `reply`. Its createdAt is `now`, but never before the context's
 * newest message (+1 ms): a worker clock behind the client's must not sort the answer before its question. */
export function buildResponse(turn: Turn, reply: Reply | string, now: Date = new Date()): AgentResponse {
  const r = typeof reply === 'string' ? textReply(reply) : reply;
  const event = turn.event;
  const newest = Math.max(Number.NEGATIVE_INFINITY, ...event.messages.map((m) => Date.parse(m.createdAt) + 1));
  const response: AgentResponse = {
    schemaVersion: 1,
    requestId: event.requestId,
    threadId: event.threadId,
    resourceId: event.resourceId,
    createdAt: new Date(Math.max(now.getTime(), newest)).toISOString(),
    input: event.messages,
    response: r.messages.map((m) => ({ ...m })),
  };
  const metadata = r.metadata ?? event.metadata;
  if (metadata != null) response.metadata = { ...metadata };
  const finishReason = r.finishReason === undefined ? 'stop' : r.finishReason;
  if (finishReason !== null) response.finishReason = finishReason;
  const readOnly = r.readOnly ?? event.memory?.readOnly;
  if (readOnly != null) response.memory = { readOnly: Boolean(readOnly) };
  return response;
}

/** A failed turn: its input, no response message, finishReason "error". */
export function failedResponse(turn: Turn, now: Date = new Date()): AgentResponse {
  return buildResponse(turn, { messages: [], finishReason: FAILED }, now);
}

/**
 * The eventIds answered lately, per partition, at most `perPartition` each (least recently seen dropped).
 *
 * In one process it drops a copy answered within the partition's last `perPartition` distinct events (the
 * service re-emitting after its own crash). Across a restart or a rebalance the worker fills it, on
 * assignment, from the requestIds already on the responses topic (`readBackPerPartition`, see AgentWorker):
 * a turn answered and acknowledged but not yet committed by the previous owner is then not answered again.
 */
export class SeenEvents {
  private readonly seen = new Map<number, Map<string, true>>();

  constructor(readonly perPartition = DEFAULT_SEEN_PER_PARTITION) {
    if (!Number.isInteger(perPartition) || perPartition < 1) throw new RangeError('perPartition must be at least 1');
  }

  has(partition: number, eventId: string): boolean {
    const ids = this.seen.get(partition);
    if (!ids?.has(eventId)) return false;
    ids.delete(eventId); // most recently seen last
    ids.set(eventId, true);
    return true;
  }

  add(partition: number, eventId: string): void {
    let ids = this.seen.get(partition);
    if (ids === undefined) {
      ids = new Map();
      this.seen.set(partition, ids);
    }
    ids.delete(eventId);
    ids.set(eventId, true);
    while (ids.size > this.perPartition) ids.delete(ids.keys().next().value as string);
  }

  size(partition: number): number {
    return this.seen.get(partition)?.size ?? 0;
  }
}
