// An observer for Observational Memory (docs/observational-memory.md): the service's persist path writes an
// ObserveRequest (or a ReflectRequest) on `agent.memory.observe` when a thread's unobserved messages pass the
// threshold; an observer answers on `agent.memory.observed`. `observerHandler(observe, reflect)` turns the
// user's model calls into the answer to one work event (pure of Kafka: run it in any consumer loop), as the
// Python SDK's `worker.observer.observer_handler`: the claim echoed (`recordId`, `generation`, `cycle`), the
// observed messages' ids and the newest one's `createdAt`; a function that throws answers with `error` (the
// service releases the claim). The service applies an answer once, to the claim it names: answering twice,
// or late, is harmless. Key the answer as the work record (`observeKey`). `ObserverWorker` is the loop around
// it on the package's Kafka seam (at-least-once: a record's offset committed after its answer is acknowledged).
// `mastraObserverHandler({ model })` is the handler running Mastra's own Observer and Reflector agents.
import type { KafkaClient, KafkaClientFactory } from './client.js';
import type { ObserveRequest, ObserveResult, ReflectRequest, ReflectResult } from './generated/events.js';
import { platformaticClient } from './platformatic.js';
import type { ConnectionOptions } from './settings.js';

export type { ObserveRequest, ObserveResult, ReflectRequest, ReflectResult } from './generated/events.js';

/** What `observe` may return beside the text: Mastra's `<current-task>`, `<suggested-response>` and
 * `<thread-title>` (the service keeps them in the thread's `metadata.mastra.om`, as Mastra does, and makes the
 * title the thread's unless `metadata.titlePinned`), and `extracted`: custom extractors' values by key (an
 * extractor's slug), merged into the thread's `metadata.mastra.om.extracted` as Mastra merges its
 * `observation.extract`' (JSON; at most 16 KiB and 8 levels deep, or the service refuses the answer). */
export interface Observation {
  observations: string;
  currentTask?: string;
  suggestedResponse?: string;
  threadTitle?: string;
  extracted?: Record<string, unknown>;
}

export type ObserveFn = (work: ObserveRequest) => Promise<Observation | string>;
export type ReflectFn = (work: ReflectRequest) => Promise<string>;
export type ObserverHandler = (work: ObserveRequest | ReflectRequest) => Promise<ObserveResult | ReflectResult>;

/** The record key of a work event and of its answer: the thread (thread scope) or the resource. */
export function observeKey(work: ObserveRequest | ReflectRequest): string {
  return work.scope === 'thread' && work.threadId ? work.threadId : work.resourceId;
}

/** Why a record is not a work event, or undefined when it is one (checked as far as an observer relies on). */
export function workProblem(value: unknown): string | undefined {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return 'not a JSON object';
  const v = value as Record<string, unknown>;
  if (v.type !== 'ObserveRequest' && v.type !== 'ReflectRequest') return `type ${JSON.stringify(v.type)} is not work`;
  if (v.schemaVersion !== 1) return `schemaVersion ${JSON.stringify(v.schemaVersion)} is not 1`;
  for (const name of ['requestId', 'resourceId', 'recordId', 'createdAt', 'activeObservations'] as const) {
    if (typeof v[name] !== 'string') return `${name} is missing or not a string`;
  }
  for (const name of ['generation', 'cycle'] as const) {
    if (!Number.isSafeInteger(v[name])) return `${name} is not a whole number`;
  }
  if (v.type === 'ObserveRequest' && !Array.isArray(v.messages)) return 'messages is not a list';
  return undefined;
}

function echo(work: ObserveRequest | ReflectRequest) {
  return {
    schemaVersion: 1 as const,
    requestId: work.requestId,
    createdAt: new Date().toISOString(),
    scope: work.scope,
    threadId: work.threadId,
    resourceId: work.resourceId,
    recordId: work.recordId,
    generation: work.generation,
    cycle: work.cycle,
  };
}

function failure(error: unknown): string {
  const text = error instanceof Error ? `${error.name}: ${error.message}` : String(error);
  return text.slice(0, 1000);
}

/** The answer to one work event from the user's `observe` (and `reflect`); see the module comment. */
export function observerHandler(observe: ObserveFn, reflect?: ReflectFn): ObserverHandler {
  return async (work) => {
    if (work.type === 'ReflectRequest') {
      const result: ReflectResult = { ...echo(work), type: 'ReflectResult', reflection: '' };
      if (reflect === undefined) return { ...result, error: 'this observer does not reflect' };
      try {
        return { ...result, reflection: await reflect(work) };
      } catch (error) {
        return { ...result, error: failure(error) };
      }
    }
    const result: ObserveResult = {
      ...echo(work),
      type: 'ObserveResult',
      observations: '',
      observedMessageIds: work.messages.map((m) => m.id).filter((id): id is string => typeof id === 'string'),
      lastObservedAt: newest(work.messages, work.createdAt),
    };
    try {
      if (work.scope === 'resource') {
        // one call per thread (its messages, the whole log): the service keeps the log per thread and moves
        // each thread's cursor to its own newest observed message
        const threads = [];
        for (const [threadId, messages] of byThread(work)) {
          const found = fields(await observe({ ...work, messages }));
          threads.push({ threadId, lastObservedAt: newest(messages, work.createdAt), ...found });
        }
        return checked({ ...result, threads });
      }
      return checked({ ...result, ...fields(await observe(work)) });
    } catch (error) {
      return { ...result, error: failure(error) };
    }
  };
}

/** The service's bounds on `extracted` (schemas/observational.py): past them the answer would be a dead
 * letter, so it is answered as `error` instead (the claim released), as the Python SDK does. */
export const EXTRACTED_MAX_BYTES = 16_384;
export const EXTRACTED_MAX_DEPTH = 8;
const UNSAFE_KEYS = new Set(['__proto__', 'constructor', 'prototype']);

/** Why `value` is not an `extracted` the service takes, or undefined. */
export function extractedProblem(value: unknown): string | undefined {
  const walk = (node: unknown, depth: number): string | undefined => {
    if (typeof node === 'object' && node !== null) {
      if (depth > EXTRACTED_MAX_DEPTH) return `nests deeper than ${EXTRACTED_MAX_DEPTH} levels`;
      const entries = Array.isArray(node) ? node.map((item) => ['', item] as const) : Object.entries(node);
      for (const [key, item] of entries) {
        if (!Array.isArray(node)) {
          if (!key || key.includes('.') || key.startsWith('$') || key.includes('\0')) return `has the key ${JSON.stringify(key)}`;
          if (UNSAFE_KEYS.has(key)) return `has the key ${JSON.stringify(key)}, which Mastra refuses in a metadata path`;
        }
        const problem = walk(item, depth + 1);
        if (problem) return problem;
      }
      return undefined;
    }
    if (typeof node === 'number' && (!Number.isFinite(node) || (Number.isInteger(node) && !Number.isSafeInteger(node)))) {
      return `has the number ${node}, not finite or past Number.MAX_SAFE_INTEGER`;
    }
    if (node !== null && !['string', 'number', 'boolean'].includes(typeof node)) return `has a ${typeof node}, which is not JSON`;
    return undefined;
  };
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return 'is not an object';
  const problem = walk(value, 1);
  if (problem) return problem;
  const size = new TextEncoder().encode(JSON.stringify(value)).length;
  return size > EXTRACTED_MAX_BYTES ? `is ${size} bytes as JSON; the limit is ${EXTRACTED_MAX_BYTES}` : undefined;
}

/** The service's bound on `threadTitle` (schemas/observational.py, in code points): a longer one would make
 * the answer a dead letter, so it is answered as `error` instead, as the Python SDK does. */
export const THREAD_TITLE_MAX_CHARS = 1000;

function checked(result: ObserveResult): ObserveResult {
  const parts = [result, ...(result.threads ?? [])];
  for (const part of parts) {
    const title = part.threadTitle;
    if (typeof title === 'string' && [...title].length > THREAD_TITLE_MAX_CHARS) {
      throw new Error(`threadTitle is ${[...title].length} characters; the limit is ${THREAD_TITLE_MAX_CHARS}`);
    }
    if (part.extracted === undefined || part.extracted === null) continue;
    const problem = extractedProblem(part.extracted);
    if (problem) throw new Error(`extracted ${problem}`);
  }
  return result;
}

type Messages = ObserveRequest['messages'];

/** The newest message's date (the work's own time only when no message has one), as `toISOString` writes it. */
function newest(messages: Messages, fallback: string): string {
  const dates = messages.map((m) => m.createdAt).filter((d): d is string => typeof d === 'string');
  const found = dates.length > 0 ? dates.reduce((a, b) => (Date.parse(b) > Date.parse(a) ? b : a)) : fallback;
  return new Date(Date.parse(found)).toISOString();
}

/** A resource's work split by thread, in the order the threads come (the service sends the oldest first). */
function byThread(work: ObserveRequest): Map<string, Messages> {
  const threads = new Map<string, Messages>();
  for (const message of work.messages) {
    const key = typeof message.threadId === 'string' && message.threadId ? message.threadId : work.resourceId;
    threads.set(key, [...(threads.get(key) ?? []), message]);
  }
  return threads;
}

function fields(answer: Observation | string) {
  const found = typeof answer === 'string' ? { observations: answer } : answer;
  return {
    observations: found.observations,
    ...(found.currentTask !== undefined ? { currentTask: found.currentTask } : {}),
    ...(found.suggestedResponse !== undefined ? { suggestedResponse: found.suggestedResponse } : {}),
    ...(found.threadTitle !== undefined ? { threadTitle: found.threadTitle } : {}),
    ...(found.extracted !== undefined ? { extracted: found.extracted } : {}),
  };
}

/** What the adapter uses of `@mastra/memory`'s `ObservationalMemory` (1.31): its `observer` and `reflector`
 * runners, public members of the exported class, which run Mastra's own Observer and Reflector agents
 * (their system prompts, the degenerate-output retry, the reflector's escalating compression). */
export interface MastraObservationalMemoryLike {
  observer: {
    call(
      existingObservations: string | undefined,
      messagesToObserve: never[],
      abortSignal?: AbortSignal,
      options?: { priorCurrentTask?: string; priorSuggestedResponse?: string; threadId?: string; resourceId?: string },
    ): Promise<{
      observations: string;
      currentTask?: string;
      suggestedContinuation?: string;
      threadTitle?: string;
      /** by extractor slug (`observation.extract`), before the extractors' `onExtracted` hooks */
      extractedValues?: Record<string, unknown>;
      extractors?: MastraExtractorLike[];
    }>;
  };
  reflector: {
    call(observations: string, manualPrompt?: string, streamContext?: undefined, observationTokensThreshold?: number): Promise<{
      observations: string;
    }>;
  };
}

/** What the adapter reads of a Mastra `Extractor`: its slug and where its value goes in the thread's OM
 * metadata (`extracted.<slug>` unless configured). */
export interface MastraExtractorLike {
  slug: string;
  metadataKeyPath: string | false;
}

const isPresent = (value: unknown) => value !== undefined && value !== null && value !== '';

/** `@mastra/memory` 1.31's `buildThreadMetadataFromExtractedValues` (not exported): each extractor's value
 * at its `metadataKeyPath` in the thread's OM metadata (`extracted.<slug>` by default); its `extracted`
 * object is what an answer's `extracted` carries, and its `currentTask` / `suggestedResponse` / `threadTitle`
 * (built-in extractors) go before the parsed ones, as Mastra's persist takes them. */
export function extractedMetadata(
  extractors: readonly MastraExtractorLike[],
  values: Record<string, unknown> | undefined,
): Record<string, unknown> {
  const metadata: Record<string, unknown> = {};
  if (!values) return metadata;
  for (const extractor of extractors) {
    if (!Object.prototype.hasOwnProperty.call(values, extractor.slug)) continue;
    const value = values[extractor.slug];
    if (!isPresent(value) || extractor.metadataKeyPath === false) continue;
    const segments = extractor.metadataKeyPath.split('.').filter(Boolean);
    // Mastra throws on these (a prototype's key): the value is left out instead
    if (segments.length === 0 || segments.some((s) => s === '__proto__' || s === 'constructor' || s === 'prototype')) continue;
    let current = metadata;
    for (const segment of segments.slice(0, -1)) {
      const next = current[segment];
      if (!next || typeof next !== 'object' || Array.isArray(next)) current[segment] = {};
      current = current[segment] as Record<string, unknown>;
    }
    current[segments[segments.length - 1]!] = value;
  }
  return metadata;
}

const nonEmpty = (value: unknown) => (typeof value === 'string' && value ? value : undefined);

export interface MastraObserverOptions {
  /** The model both agents run on: what `new ObservationalMemory({ model })` takes (a model router id such as
   * `'openai/gpt-4o-mini'`, or an AI SDK language model). Ignored when `memory` is given. */
  model?: unknown;
  /** Your own `ObservationalMemory` (its models, `observation` / `reflection` options and instructions); by
   * default one is made on `model`, thread scope, over an in-memory store (it stores nothing: the service
   * does). */
  memory?: MastraObservationalMemoryLike;
}

// a variable specifier: the optional peers are loaded only when the adapter is used (and the CommonJS build
// needs no resolution of their subpath exports at compile time)
const MEMORY_PROCESSORS = '@mastra/memory/processors';
const CORE_STORAGE = '@mastra/core/storage';

async function defaultMemory(model: unknown): Promise<MastraObservationalMemoryLike> {
  if (model === undefined) throw new Error('mastraObserverHandler needs `model` (or your own `memory`)');
  const { ObservationalMemory } = (await import(MEMORY_PROCESSORS)) as {
    ObservationalMemory: new (config: Record<string, unknown>) => MastraObservationalMemoryLike;
  };
  const { InMemoryStore } = (await import(CORE_STORAGE)) as {
    InMemoryStore: new () => { getStore(name: 'memory'): Promise<unknown> };
  };
  const storage = await new InMemoryStore().getStore('memory');
  return new ObservationalMemory({ storage, scope: 'thread', model });
}

/**
 * An observer running Mastra's own Observer and Reflector (`@mastra/memory` ≥ 1.31, an optional peer, with
 * `@mastra/core`): each ObserveRequest is the Observer agent's call on the work's messages and log (its
 * `<observations>`, `<current-task>` and `<suggested-response>` parsed by Mastra; the service appends the
 * observations to the log as Mastra's `wrapObservations` does), each ReflectRequest the Reflector's on the
 * whole log with the request's `observationTokens` as its target. A model error answers with `error`.
 */
export function mastraObserverHandler(options: MastraObserverOptions): ObserverHandler {
  let memory: Promise<MastraObservationalMemoryLike> | undefined;
  const om = () => (memory ??= options.memory ? Promise.resolve(options.memory) : defaultMemory(options.model));
  return observerHandler(
    async (work) => {
      // Mastra's messages: its stored shape, with `createdAt` a Date
      const messages = work.messages.map((m) => ({
        ...m,
        ...(typeof m.createdAt === 'string' ? { createdAt: new Date(m.createdAt) } : {}),
      }));
      const found = await (await om()).observer.call(work.activeObservations || undefined, messages as never[], undefined, {
        // resource scope: `observerHandler` calls this once per thread, so the messages' thread is the one
        ...(work.threadId ? { threadId: work.threadId } : messages[0]?.threadId ? { threadId: messages[0].threadId } : {}),
        resourceId: work.resourceId,
      });
      // the custom extractors' values where Mastra's persist puts them (`observation.extract` on your
      // `memory`); their `onExtracted` hooks are not run here
      const metadata = extractedMetadata(found.extractors ?? [], found.extractedValues);
      const currentTask = nonEmpty(metadata.currentTask) ?? found.currentTask;
      const suggestedResponse = nonEmpty(metadata.suggestedResponse) ?? found.suggestedContinuation;
      const threadTitle = nonEmpty(metadata.threadTitle) ?? found.threadTitle;
      const extracted = metadata.extracted;
      return {
        observations: found.observations,
        ...(currentTask ? { currentTask } : {}),
        ...(suggestedResponse ? { suggestedResponse } : {}),
        // Mastra's Observer writes one when asked (`observation: { threadTitle: true }` on your `memory`)
        ...(threadTitle ? { threadTitle } : {}),
        ...(extracted && typeof extracted === 'object' && !Array.isArray(extracted)
          ? { extracted: extracted as Record<string, unknown> }
          : {}),
      };
    },
    async (work) => {
      const found = await (await om()).reflector.call(
        work.activeObservations,
        undefined,
        undefined,
        work.observationTokens,
      );
      return found.observations;
    },
  );
}

export interface ObserverWorkerOptions extends ConnectionOptions {
  /** The observers' consumer group (default `message-history-observer`). */
  groupId?: string;
  /** `MESSAGE_HISTORY_OBSERVE_REQUESTS_TOPIC` (default `agent.memory.observe`). */
  workTopic?: string;
  /** `MESSAGE_HISTORY_OBSERVE_RESULTS_TOPIC` (default `agent.memory.observed`). */
  resultsTopic?: string;
  clientId?: string;
  /** The Kafka client: `platformaticClient` (default, as the AgentWorker's), `kafkajsClient`, or
   * `memoryClient(broker)` in tests. */
  client?: KafkaClientFactory;
}

/** Answers `agent.memory.observe` with `handler` on `agent.memory.observe`'s partitions, one record at a time
 * per partition; a record that is not work is skipped (the service never writes one). */
export class ObserverWorker {
  private readonly client: KafkaClient;
  private readonly workTopic: string;
  private readonly resultsTopic: string;
  /** Records answered since `start`. */
  answered = 0;
  /** Records skipped (not work) since `start`. */
  skipped = 0;

  constructor(
    private readonly handler: ObserverHandler,
    options: ObserverWorkerOptions,
  ) {
    const groupId = options.groupId ?? 'message-history-observer';
    this.workTopic = options.workTopic ?? 'agent.memory.observe';
    this.resultsTopic = options.resultsTopic ?? 'agent.memory.observed';
    this.client = (options.client ?? platformaticClient)({ ...options, groupId, clientId: options.clientId ?? groupId });
  }

  async start(): Promise<void> {
    await this.client.connect();
    await this.client.consume({
      topic: this.workTopic,
      onAssignment: () => undefined,
      partitionsConcurrently: 1,
      eachRecord: async (record) => {
        let work: unknown;
        try {
          work = JSON.parse(record.value?.toString('utf8') ?? 'null');
        } catch {
          work = undefined;
        }
        if (workProblem(work) === undefined) {
          const event = work as ObserveRequest | ReflectRequest;
          const answer = await this.handler(event);
          await this.client.send(this.resultsTopic, [
            { key: observeKey(event), value: JSON.stringify(answer), headers: record.headers ?? {} },
          ]);
          this.answered += 1;
        } else {
          this.skipped += 1;
        }
        await this.client.commit(this.workTopic, record.partition, BigInt(record.offset) + 1n);
      },
    });
  }

  /** Leaves the group (the record in flight finishes) and closes the producer. */
  async stop(): Promise<void> {
    await this.client.leave();
    await this.client.close();
  }
}
