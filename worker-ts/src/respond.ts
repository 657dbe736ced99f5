// One turn through the handler, without Kafka: the turn's own AbortSignal (fired when the handler outlives its
// time or the worker gives the turn up at shutdown), the reply checked, the AgentResponse built or a failed
// turn with its reason. The worker and the testing harness (`@message-history/worker/testing`) both run it.
import type { AgentResponse } from './events.js';
import { buildResponse, failedResponse, replyProblem, Turn, type Reply } from './turn.js';
import { responseProblem } from './validate.js';

/** The user's code: one turn in, its reply out (a string is one assistant text message). */
export type Handler = (turn: Turn) => Promise<Reply | string>;

/** What became of a turn: its response (a failed turn carries `failure`, the reason), or `gaveUp`. */
export type Outcome =
  | { kind: 'answered'; response: AgentResponse }
  | { kind: 'failed'; response: AgentResponse; failure: string }
  | { kind: 'gave-up' };

export interface RespondOptions {
  /** The handler is given up after this long (its signal aborted), the turn answered as failed. */
  timeoutMs?: number;
  /** The worker giving up every turn in flight (shutdown grace over): the turn's signal is aborted too. */
  giveUp?: AbortSignal;
  now?: () => Date;
}

/** Why the turn's signal was aborted: `signal.reason` is one of these. */
export class TurnTimeout extends Error {
  override readonly name = 'TurnTimeout';
}
export class TurnGivenUp extends Error {
  override readonly name = 'TurnGivenUp';
}

const describe = (error: unknown): string =>
  error instanceof Error ? `${error.name}: ${error.message}` : String(error);

/**
 * Runs `handler` on the turn made by `makeTurn(signal)` and returns the outcome. The signal is the turn's own:
 * aborted (reason TurnTimeout) when `timeoutMs` is over and (reason TurnGivenUp) when `giveUp` fires, so a
 * model call given the signal stops instead of running and billing on.
 */
export async function respond(
  handler: Handler,
  makeTurn: (signal: AbortSignal) => Turn,
  options: RespondOptions = {},
): Promise<{ turn: Turn; outcome: Outcome }> {
  const abort = new AbortController();
  const turn = makeTurn(abort.signal);
  const now = options.now ?? (() => new Date());
  const onGiveUp = (): void => abort.abort(new TurnGivenUp('the worker gave the turn up (shutdown)'));
  if (options.giveUp?.aborted) onGiveUp();
  options.giveUp?.addEventListener('abort', onGiveUp, { once: true });
  let timer: NodeJS.Timeout | undefined;
  if (options.timeoutMs !== undefined) {
    const limit = options.timeoutMs;
    timer = setTimeout(() => abort.abort(new TurnTimeout(`handler still running after ${limit} ms`)), limit);
  }
  const aborted = new Promise<never>((_, reject) => {
    const fail = (): void => reject(abort.signal.reason);
    if (abort.signal.aborted) fail();
    else abort.signal.addEventListener('abort', fail, { once: true });
  });
  aborted.catch(() => undefined);
  try {
    const reply = await Promise.race([Promise.resolve().then(() => handler(turn)), aborted]);
    const problem = typeof reply === 'string' ? undefined : replyProblem(reply);
    if (problem !== undefined) {
      return { turn, outcome: { kind: 'failed', response: failedResponse(turn, now()), failure: `the reply cannot be sent: ${problem}` } };
    }
    const response = buildResponse(turn, reply, now());
    const invalid = responseProblem(response);
    if (invalid !== undefined) {
      const failure = `the reply does not fit the AgentResponse schema: ${invalid}`;
      return { turn, outcome: { kind: 'failed', response: failedResponse(turn, now()), failure } };
    }
    return { turn, outcome: { kind: 'answered', response } };
  } catch (error) {
    if (abort.signal.reason instanceof TurnGivenUp) return { turn, outcome: { kind: 'gave-up' } };
    return { turn, outcome: { kind: 'failed', response: failedResponse(turn, now()), failure: describe(error) } };
  } finally {
    clearTimeout(timer);
    options.giveUp?.removeEventListener('abort', onGiveUp);
  }
}
