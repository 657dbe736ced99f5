// A Mastra Agent as the worker's handler. The service recalls the history into each turn and saves each
// answer, so the Agent must run WITHOUT Mastra `memory`: with it, every turn would be recalled and saved twice.
import type { ResponseMessage } from './events.js';
import type { Reply, Turn } from './turn.js';

/** What the adapter uses of a Mastra `Agent` (`@mastra/core` 1.x): `generate` and `hasOwnMemory`. */
export interface MastraAgentLike {
  name?: string;
  hasOwnMemory?: () => boolean;
  generate(messages: never, options?: never): Promise<{
    messages: readonly { id: string; createdAt?: unknown; [field: string]: unknown }[];
    finishReason?: string | null;
  }>;
}

export interface MastraHandlerOptions {
  /** Passed as `generate`'s second argument (maxSteps, toolChoice, ...); never `memory`. Its `abortSignal` is
   * the turn's (`turn.signal`: aborted on the handler timeout and at shutdown). */
  generateOptions?: Record<string, unknown>;
  /** Keep the ids Mastra gave the new messages (default false: the service derives them from the requestId,
   * so an answer produced twice is stored once). */
  keepMessageIds?: boolean;
}

/**
 * The handler running `agent.generate` on the turn's whole context (the recalled history and the input,
 * oldest first, `source` dropped) and answering with the messages the Agent added, in Mastra's stored shape.
 * Throws at once if the Agent has its own memory.
 */
export function mastraHandler(
  agent: MastraAgentLike,
  options: MastraHandlerOptions = {},
): (turn: Turn) => Promise<Reply> {
  if (agent.hasOwnMemory?.()) {
    throw new Error(
      `agent ${agent.name ?? ''} has Mastra memory: run it without \`memory\` (message-history recalls and saves the history)`,
    );
  }
  if (options.generateOptions && 'memory' in options.generateOptions) {
    throw new Error('generateOptions.memory: the Agent must not use Mastra memory behind message-history');
  }
  return async (turn: Turn): Promise<Reply> => {
    const given = new Set(turn.messages.map((m) => m.id));
    const context = turn.messages.map(({ source: _source, ...message }) => ({
      ...message,
      createdAt: new Date(message.createdAt),
    }));
    // The turn's signal: a timed-out or given-up turn stops the model call (and its billing) too.
    const generateOptions = { ...options.generateOptions, abortSignal: turn.signal };
    const result = await agent.generate(context as never, generateOptions as never);
    const messages: ResponseMessage[] = result.messages
      .filter((m) => !given.has(m.id))
      .map(({ id, createdAt: _createdAt, ...message }) =>
        (options.keepMessageIds ? { id, ...message } : message) as ResponseMessage,
      );
    return { messages, finishReason: result.finishReason ?? 'stop' };
  };
}
