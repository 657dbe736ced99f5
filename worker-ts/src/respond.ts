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

/**
 * Thrown by a handler (or any error with `retriable: true`): the turn cannot be answered NOW (a provider's
 * rate limit, an overloaded model), not a failed turn. The worker backs off and calls the handler again for
 * the same turn (the turns behind it on the partition wait), until it answers or fails, or the worker stops
 * (the turn is then left uncommitted for the next owner). A failed turn instead is answered at once and
 * saves nothing of the user's message.
 */
export class RetryLater extends Error {
  override readonly name = 'RetryLater';
  readonly retriable = true;
  constructor(
    message: string,
    /** Wait at least this long before the next attempt (e.g. the provider's Retry-After). */
    readonly afterMs?: number,
  ) {
    super(message);
  }
}

export const isRetryLater = (error: unknown): boolean =>
  typeof error === 'object' && error !== null && (error as { retriable?: unknown }).retriable === true;

export interface RespondOptions {
  /** Backoff before a RetryLater turn's next attempt: doubling from `retryInitialMs` (1 s) to `retryMaxMs`
   * (60 s), equal jitter; a RetryLater's `afterMs` is the floor. */
  retryInitialMs?: number;
  retryMaxMs?: number;
  /** Called before each backoff (the worker logs and counts it). */
  onRetry?: (info: { attempt: number; delayMs: number; error: string }) => void;
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
  for (let attempt = 0; ; attempt += 1) {
    const result = await respondOnce(handler, makeTurn, options);
    if (result.retry === undefined) return result;
    const error = result.retry;
    const initial = options.retryInitialMs ?? 1_000;
    const ceiling = Math.min(options.retryMaxMs ?? 60_000, initial * 2 ** attempt);
    const floor = error instanceof RetryLater ? (error.afterMs ?? 0) : 0;
    const delayMs = Math.max(floor, ceiling / 2 + Math.random() * (ceiling / 2));
    options.onRetry?.({ attempt: attempt + 1, delayMs: Math.round(delayMs), error: describe(error) });
    if (!(await pause(delayMs, options.giveUp))) return { turn: result.turn, outcome: { kind: 'gave-up' } };
  }
}

/** Waits `ms`; false if `giveUp` fired first. */
function pause(ms: number, giveUp: AbortSignal | undefined): Promise<boolean> {
  return new Promise((resolve) => {
    if (giveUp?.aborted) return resolve(false);
    const onAbort = (): void => {
      clearTimeout(timer);
      resolve(false);
    };
    const timer = setTimeout(() => {
      giveUp?.removeEventListener('abort', onAbort);
      resolve(true);
    }, ms);
    giveUp?.addEventListener('abort', onAbort, { once: true });
  });
}

async function respondOnce(
  handler: Handler,
  makeTurn: (signal: AbortSignal) => Turn,
  options: RespondOptions,
): Promise<{ turn: Turn; outcome: Outcome; retry?: unknown }> {
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
    if (isRetryLater(error) && !abort.signal.aborted) return { turn, outcome: { kind: 'gave-up' }, retry: error };
    return { turn, outcome: { kind: 'failed', response: failedResponse(turn, now()), failure: describe(error) } };
  } finally {
    clearTimeout(timer);
    options.giveUp?.removeEventListener('abort', onGiveUp);
  }
}
