// The wire events a worker reads and writes (docs/events.md): EnrichedRequest in, AgentResponse out.
// Only the fields a worker uses are typed closely; the rest pass through as they came.

export type Source = 'memory' | 'input';

/** A message of the context, in Mastra's stored shape (MastraDBMessage), tagged with where it came from. */
export interface EnrichedMessage {
  id: string;
  role: string;
  createdAt: string;
  content: unknown;
  source: Source;
  threadId?: string;
  resourceId?: string;
  type?: string;
  [field: string]: unknown;
}

export interface HistoryInfo {
  recalled: number;
  limit: number | null;
  complete?: boolean;
  waitedMs?: number;
  [field: string]: unknown;
}

export interface EnrichedRequest {
  schemaVersion: 1;
  requestId: string;
  /** The id to drop duplicates by (equal to `requestId`): the service re-emits after a crash with the same one. */
  eventId: string;
  threadId: string;
  resourceId: string;
  createdAt: string;
  metadata?: Record<string, unknown> | null;
  memory?: { readOnly?: boolean | null; [field: string]: unknown } | null;
  history: HistoryInfo;
  messages: EnrichedMessage[];
  [field: string]: unknown;
}

/** A message the handler answers with: a MastraDBMessage; leave `id` and `createdAt` out to let the service
 * derive them from the `requestId` (an answer produced twice is then stored once). */
export interface ResponseMessage {
  role: string;
  content: unknown;
  id?: string;
  createdAt?: string;
  [field: string]: unknown;
}

export interface AgentResponse {
  schemaVersion: 1;
  requestId: string;
  threadId: string;
  resourceId: string;
  createdAt: string;
  input: EnrichedMessage[];
  response: ResponseMessage[];
  finishReason?: string;
  metadata?: Record<string, unknown>;
  memory?: { readOnly: boolean };
}

/** Why a record is not an EnrichedRequest, or undefined when it is one (checked as far as a worker relies on). */
export function enrichedProblem(value: unknown): string | undefined {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return 'not a JSON object';
  const v = value as Record<string, unknown>;
  if (v.schemaVersion !== 1) return `schemaVersion ${JSON.stringify(v.schemaVersion)} is not 1`;
  for (const name of ['requestId', 'eventId', 'threadId', 'resourceId', 'createdAt'] as const) {
    if (typeof v[name] !== 'string' || v[name] === '') return `${name} is missing or not a string`;
  }
  if (!Array.isArray(v.messages)) return 'messages is not a list';
  for (const [i, m] of (v.messages as unknown[]).entries()) {
    if (typeof m !== 'object' || m === null) return `messages[${i}] is not an object`;
    const message = m as Record<string, unknown>;
    if (typeof message.id !== 'string' || typeof message.role !== 'string') return `messages[${i}] has no id or role`;
    if (message.source !== 'memory' && message.source !== 'input') return `messages[${i}] has no source`;
    if (typeof message.createdAt !== 'string') return `messages[${i}] has no createdAt`;
  }
  if (typeof v.history !== 'object' || v.history === null) return 'history is missing';
  return undefined;
}
