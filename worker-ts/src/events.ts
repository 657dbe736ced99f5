// The wire events a worker reads and writes (docs/events.md): EnrichedRequest in, AgentResponse out. The types
// are generated from the contract's JSON Schemas (src/generated/events.ts, `npm run generate`); a drift test
// keeps them current.
import type { EnrichedMessage, Message } from './generated/events.js';

export type {
  AgentResponse,
  DataPart,
  EnrichedMessage,
  EnrichedRequest,
  ErrorPart,
  FilePart,
  HistoryInfo,
  MemoryBoundary,
  MemoryOptions,
  Message,
  MessageContent,
  ReasoningPart,
  SourceDocumentPart,
  SourcePart,
  StepStartPart,
  TextPart,
  ToolInvocationPart,
  TurnMessage,
  UnknownPart,
} from './generated/events.js';

export type Source = EnrichedMessage['source'];
/** A message the handler answers with: a MastraDBMessage; leave `id` and `createdAt` out to let the service
 * derive them from the `requestId` (an answer produced twice is then stored once). */
export type ResponseMessage = Message;
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
