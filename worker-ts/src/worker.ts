// AgentWorker: agent.requests.enriched in, agent.responses out, around the user's async handler. The same
// behaviour as the Python SDK's worker.AgentWorker (docs/worker.md, "What a worker must get right"), on KafkaJS.
import { randomUUID } from 'node:crypto';
import { EventEmitter } from 'node:events';
import { readFileSync } from 'node:fs';

import {
  Kafka,
  logLevel,
  Partitioners,
  type Consumer,
  type IHeaders,
  type KafkaConfig,
  type Producer,
} from 'kafkajs';

import { enrichedProblem, type AgentResponse, type EnrichedRequest } from './events.js';
import { respond, type Handler } from './respond.js';
import { connectionFromEnv, type ConnectionOptions, type Env } from './settings.js';
import { loadTracing, tracingOff, type Tracing, type TurnSpan } from './tracing.js';
import { isOutage, runTransaction, type TxPartition, type TxProducer } from './transactions.js';
import { DEFAULT_SEEN_PER_PARTITION, FAILED, failedResponse, SeenEvents, Turn } from './turn.js';

export type { Handler } from './respond.js';

export type LogLevel = 'debug' | 'info' | 'warn' | 'error';
export type Logger = (level: LogLevel, message: string, fields?: Record<string, unknown>) => void;

/** The settings, in the package's own terms (no Kafka client's types): `brokers`, `ssl` and `sasl` come from
 * ConnectionOptions (`fromEnv` reads them from the service's variables). */
export interface WorkerOptions extends ConnectionOptions {
  /** The worker's consumer group; a new group starts from the earliest offset. */
  groupId: string;
  enrichedTopic?: string;
  responsesTopic?: string;
  clientId?: string;
  /** The group's session timeout: a killed worker's partitions move on after this long (default 30 s). */
  sessionTimeoutMs?: number;
  /** How long a Kafka request waits for its answer before it counts as an outage (default 30 s, KafkaJS').
   * Under exactly-once a commit left unanswered is settled before anything is sent again. */
  requestTimeoutMs?: number;
  /** How often the worker heartbeats to its group (default 3 s). */
  heartbeatIntervalMs?: number;
  /** Partitions answered at the same time (turns of one partition, so of one thread, stay in order). */
  partitionsConsumedConcurrently?: number;
  /** A handler still running after this long answers a failed turn (default: no limit). */
  handlerTimeoutMs?: number;
  /** On SIGTERM/SIGINT or stop(): how long the turns in flight may take before they are given up. */
  shutdownGraceMs?: number;
  /** SIGTERM and SIGINT call stop() (default true); false leaves signals to the application. */
  handleSignals?: boolean;
  seenPerPartition?: number;
  /**
   * On assignment, how many of the newest records of each owned partition of the responses topic are read
   * back for their requestIds, so a turn the previous owner answered but did not commit is not answered
   * again (default 1000; 0 turns it off). Needs equal partition counts on the two topics, as the service.
   */
  readBackPerPartition?: number;
  /** How long the read-back may take before the worker goes on with what it read (default 30 s). */
  readBackTimeoutMs?: number;
  /**
   * 'exactly-once' (the service's MESSAGE_HISTORY_PROCESSING_GUARANTEE): each response goes out with its
   * consumed offset in one Kafka transaction, from a transactional producer per owned partition (id
   * `{groupId}-{enrichedTopic}-{partition}`, as the service's, so a worker that lost its partitions while
   * paused is fenced). Readers of the responses (the service's persist path) must read committed records.
   * Default 'at-least-once'.
   */
  processingGuarantee?: 'at-least-once' | 'exactly-once';
  /** A span per turn ("agent turn", continuing the request's traceparent) through `@opentelemetry/api` when
   * it is installed (default true; the application registers the tracer provider); false: none. */
  tracing?: boolean;
  logger?: Logger;
}

export interface WorkerStats {
  answered: number;
  /** Answered as failed turns (finishReason "error"): the handler threw, timed out, said so, or its reply could
   * not be sent (messages without role or content, too large for Kafka). */
  failed: number;
  /** Dropped: the eventId was already answered (in this process, or found on the responses topic). */
  duplicates: number;
  /** Skipped: not an EnrichedRequest. */
  invalid: number;
  /** Attempts the handler asked to redo later (RetryLater, or an error with `retriable: true`). */
  retried: number;
}

const RETRY_INITIAL_MS = 200;
const RETRY_MAX_MS = 5_000;
const HEARTBEAT_EVERY_MS = 3_000;

const sleep = (ms: number): Promise<void> => new Promise((resolve) => setTimeout(resolve, ms));

const jsonLogger: Logger = (level, message, fields) => {
  process.stderr.write(JSON.stringify({ time: new Date().toISOString(), level, message, ...fields }) + '\n');
};

function isTooLarge(error: unknown): boolean {
  const e = error as { type?: string; cause?: unknown } | null;
  if (!e) return false;
  return e.type === 'MESSAGE_TOO_LARGE' || (e.cause !== undefined && e.cause !== error && isTooLarge(e.cause));
}

/** The package's TLS and SASL settings as KafkaJS takes them. */
function kafkajsSecurity(options: ConnectionOptions): Pick<KafkaConfig, 'ssl' | 'sasl'> {
  const out: Pick<KafkaConfig, 'ssl' | 'sasl'> = {};
  if (options.ssl !== undefined) out.ssl = options.ssl;
  if (options.sasl !== undefined) out.sasl = { ...options.sasl } as KafkaConfig['sasl'];
  return out;
}

/** "Equal jitter": half fixed, half random, so many workers do not retry in step. */
function backoff(attempt: number): number {
  const ceiling = Math.min(RETRY_MAX_MS, RETRY_INITIAL_MS * 2 ** attempt);
  return ceiling / 2 + Math.random() * (ceiling / 2);
}

function requestIdOf(value: Buffer | null): string | undefined {
  if (!value) return undefined;
  try {
    const parsed = JSON.parse(value.toString('utf8')) as { requestId?: unknown };
    return typeof parsed.requestId === 'string' ? parsed.requestId : undefined;
  } catch {
    return undefined;
  }
}

/**
 * A worker: call `run()` (it resolves once stopped, by SIGTERM/SIGINT or `stop()`).
 *
 * Per turn: the handler is called with the Turn; its Reply becomes the AgentResponse (ids and metadata of the
 * request, `input` = the context with its `source`, `response` = the reply's messages, `finishReason`), sent
 * keyed by the threadId with the enriched record's headers, acks from all in-sync replicas, retried while
 * Kafka is unavailable; only then is the enriched offset committed. A handler that throws (or times out)
 * answers a failed turn (`finishReason: "error"`, no message). Events: 'answered', 'failed', 'duplicate',
 * 'invalid' (each with the turn or the record's position), 'assigned', 'stopped'.
 */
/** The events an AgentWorker emits, with what each listener gets (typed `on`, `once`, `emit`). */
export interface WorkerEvents {
  answered: [{ turn: Turn; response: AgentResponse }];
  /** A failed turn was answered (finishReason "error"); `failure` says why. */
  failed: [{ turn: Turn; response: AgentResponse; failure: string }];
  duplicate: [{ partition: number; offset: string; eventId: string; requestId: string }];
  invalid: [{ partition: number; offset: string }];
  assigned: [{ partitions: number[]; readBack: number[] }];
  /** The read-back could not read the responses topic (rights, outage): duplicates are not dropped there. */
  'read-back-off': [{ partitions: number[]; error: string }];
  /** Committed unanswered: even the failed-turn response (the input alone) is too large for Kafka. */
  dropped: [{ turn: Turn; failure: string }];
  /** The handler asked to retry the turn later: the worker waits `delayMs`, then calls it again. */
  retrying: [{ requestId: string; attempt: number; delayMs: number; error: string }];
  stopped: [WorkerStats];
}

export class AgentWorker extends EventEmitter<WorkerEvents> {
  readonly stats: WorkerStats = { answered: 0, failed: 0, duplicates: 0, invalid: 0, retried: 0 };
  readonly enrichedTopic: string;
  readonly responsesTopic: string;
  readonly groupId: string;

  private readonly kafka: Kafka;
  private readonly producer: Producer;
  private readonly consumer: Consumer;
  private readonly seen: SeenEvents;
  private readonly log: Logger;
  private readonly giveUp = new AbortController();
  private readonly warmups = new Map<number, Promise<void>>();
  private owned = new Set<number>();
  private readonly exactlyOnce: boolean;
  /** exactly-once: a transactional producer per owned partition, and the offset committed when it was opened. */
  private readonly txProducers = new Map<number, Producer>();
  private readonly floors = new Map<number, bigint>();
  /** exactly-once: partitions whose producer is being replaced (stuck after an unanswered commit or abort). */
  private readonly stuck = new Set<number>();
  private stopping: Promise<void> | undefined;
  private tracing: Tracing = tracingOff;
  private signalsInstalled: (() => void) | undefined;

  constructor(
    private readonly handler: Handler,
    private readonly options: WorkerOptions,
  ) {
    super();
    this.enrichedTopic = options.enrichedTopic ?? 'agent.requests.enriched';
    this.responsesTopic = options.responsesTopic ?? 'agent.responses';
    this.groupId = options.groupId;
    this.log = options.logger ?? jsonLogger;
    this.seen = new SeenEvents(options.seenPerPartition ?? DEFAULT_SEEN_PER_PARTITION);
    this.kafka = new Kafka({
      logLevel: logLevel.WARN,
      clientId: options.clientId ?? options.groupId,
      brokers: options.brokers,
      ...kafkajsSecurity(options),
      ...(options.requestTimeoutMs === undefined ? {} : { requestTimeout: options.requestTimeoutMs }),
    });
    // The Java-compatible (murmur2) partitioner, as the service's: a thread's records share a partition.
    this.producer = this.kafka.producer({ idempotent: true, createPartitioner: Partitioners.DefaultPartitioner });
    // Committed records only: under exactly-once the service's aborted outputs are never answered.
    this.consumer = this.kafka.consumer({
      groupId: options.groupId,
      readUncommitted: false,
      ...(options.sessionTimeoutMs === undefined ? {} : { sessionTimeout: options.sessionTimeoutMs }),
      ...(options.heartbeatIntervalMs === undefined ? {} : { heartbeatInterval: options.heartbeatIntervalMs }),
    });
    this.exactlyOnce = options.processingGuarantee === 'exactly-once';
  }

  /** A worker configured from the service's variables: KAFKA_BOOTSTRAP_SERVERS, the security ones
   * (MESSAGE_HISTORY_KAFKA_SECURITY_PROTOCOL, _SASL_MECHANISM, _SASL_USERNAME, _SASL_PASSWORD, _SSL_CAFILE: see
   * connectionFromEnv), MESSAGE_HISTORY_ENRICHED_TOPIC, MESSAGE_HISTORY_RESPONSES_TOPIC and
   * MESSAGE_HISTORY_PROCESSING_GUARANTEE (their defaults when unset); `options` override them. */
  static fromEnv(
    handler: Handler,
    options: Partial<WorkerOptions> & { groupId: string },
    env: Env = process.env,
  ): AgentWorker {
    return new AgentWorker(handler, {
      ...connectionFromEnv(env, (path) => readFileSync(path, 'utf8')),
      enrichedTopic: env.MESSAGE_HISTORY_ENRICHED_TOPIC || undefined,
      responsesTopic: env.MESSAGE_HISTORY_RESPONSES_TOPIC || undefined,
      processingGuarantee: env.MESSAGE_HISTORY_PROCESSING_GUARANTEE === 'exactly-once' ? 'exactly-once' : undefined,
      ...options,
    });
  }

  /** Connects, joins the group and answers until stopped; resolves after the consumer left and the producer
   * flushed. Rejects if the consumer crashes for good (a refusal such as "not authorized"). */
  async run(): Promise<WorkerStats> {
    if (this.options.handleSignals ?? true) this.installSignals();
    const crashed = new Promise<never>((_, reject) => {
      this.consumer.on(this.consumer.events.CRASH, (event) => {
        if (!event.payload.restart) reject(event.payload.error);
      });
    });
    crashed.catch(() => undefined); // observed below; never an unhandled rejection
    this.consumer.on(this.consumer.events.GROUP_JOIN, (event) => {
      const assigned = new Set(event.payload.memberAssignment[this.enrichedTopic] ?? []);
      const fresh = [...assigned].filter((p) => !this.owned.has(p));
      const gone = [...this.owned].filter((p) => !assigned.has(p));
      this.owned = assigned;
      void this.closeTransactions(gone);
      // Synchronously here, before the first fetch of the new assignment: each turn awaits its partition's.
      const warmup = Promise.all([this.readBack(fresh), this.openTransactions(fresh)]).then(() => undefined);
      for (const partition of fresh) this.warmups.set(partition, warmup);
      this.emit('assigned', { partitions: [...assigned].sort((a, b) => a - b), readBack: fresh });
    });
    this.tracing = this.options.tracing === false ? tracingOff : await loadTracing();
    await this.producer.connect();
    await this.consumer.connect();
    await this.consumer.subscribe({ topics: [this.enrichedTopic], fromBeginning: true });
    const stopped = new Promise<void>((resolve) => this.once('stopped', () => resolve()));
    await this.consumer.run({
      autoCommit: false,
      partitionsConsumedConcurrently: this.options.partitionsConsumedConcurrently ?? 4,
      eachMessage: async ({ topic, partition, message, heartbeat }) => {
        await this.onRecord(topic, partition, message.offset, message.value, message.headers, heartbeat);
      },
    });
    this.log('info', 'agent worker running', { topic: this.enrichedTopic, groupId: this.groupId });
    await Promise.race([stopped, crashed]).finally(() => this.signalsInstalled?.());
    return this.stats;
  }

  /** Stop fetching, let the turns in flight finish (at most shutdownGraceMs, then they are given up and not
   * committed: the next owner answers them), leave the group, flush the producer. */
  stop(): Promise<void> {
    this.stopping ??= (async () => {
      const grace = this.options.shutdownGraceMs ?? 25_000;
      let timer: NodeJS.Timeout | undefined;
      const late = new Promise<'late'>((resolve) => {
        timer = setTimeout(() => resolve('late'), grace);
      });
      const leaving = this.consumer.disconnect(); // waits for the turn in flight of each partition
      if ((await Promise.race([leaving.then(() => 'left' as const), late])) === 'late') {
        this.log('warn', 'shutdown grace over: giving up the turns in flight (not committed)', { graceMs: grace });
        this.giveUp.abort();
        await leaving;
      }
      clearTimeout(timer);
      await this.closeTransactions([...this.txProducers.keys()]);
      await this.producer.disconnect();
      this.log('info', 'agent worker stopped', { ...this.stats });
      this.emit('stopped', { ...this.stats });
    })();
    return this.stopping;
  }

  private installSignals(): void {
    const onSignal = (signal: NodeJS.Signals): void => {
      this.log('info', 'stopping', { signal });
      void this.stop();
    };
    process.on('SIGTERM', onSignal);
    process.on('SIGINT', onSignal);
    this.signalsInstalled = () => {
      process.off('SIGTERM', onSignal);
      process.off('SIGINT', onSignal);
    };
  }

  private async commit(partition: number, offset: string): Promise<void> {
    const next = (BigInt(offset) + 1n).toString();
    await this.consumer.commitOffsets([{ topic: this.enrichedTopic, partition, offset: next }]);
  }

  /**
   * exactly-once: a transactional producer per new partition, its id initialised (an empty transaction:
   * InitProducerId fences the id's previous holder and completes its open transaction); then the group's
   * committed offset, read after that, is the partition's floor: a record below it was answered and
   * committed by the previous owner (the consumer may have started from an offset read before).
   */
  private async openTransactions(partitions: number[]): Promise<void> {
    if (!this.exactlyOnce || partitions.length === 0) return;
    await Promise.all(
      partitions.map(async (partition) => {
        for (let attempt = 0; ; attempt += 1) {
          try {
            if (!this.txProducers.has(partition)) {
              const producer = this.newTxProducer(partition);
              await producer.connect();
              await (await producer.transaction()).abort();
              this.txProducers.set(partition, producer);
            }
            break;
          } catch (error) {
            if (!isOutage(error) || this.giveUp.signal.aborted) throw error;
            await sleep(backoff(attempt));
          }
        }
      }),
    );
    const admin = this.kafka.admin();
    await admin.connect();
    try {
      const [committed] = await admin.fetchOffsets({ groupId: this.groupId, topics: [this.enrichedTopic] });
      for (const { partition, offset } of committed?.partitions ?? []) {
        if (partitions.includes(partition) && BigInt(offset) >= 0n) this.floors.set(partition, BigInt(offset));
      }
    } finally {
      await admin.disconnect().catch(() => undefined);
    }
  }

  private async closeTransactions(partitions: number[]): Promise<void> {
    await Promise.all(
      partitions.map(async (partition) => {
        const producer = this.txProducers.get(partition);
        this.txProducers.delete(partition);
        this.floors.delete(partition);
        this.stuck.delete(partition);
        await producer?.disconnect().catch(() => undefined);
      }),
    );
  }

  /** exactly-once: the partition's transactional producer, and how a commit in doubt is settled on it. */
  private txPartition(partition: number): TxPartition {
    return {
      groupId: this.groupId,
      topic: this.enrichedTopic,
      partition,
      producer: () => this.txProducers.get(partition),
      reopen: () => this.reopenTransactions(partition),
      stuck: () => this.stuck.has(partition),
      committed: () => this.committedOffset(partition),
      givenUp: () => this.giveUp.signal.aborted,
      pause: (attempt) => sleep(backoff(attempt)),
      log: (level, message, fields) => this.log(level, message, fields),
    };
  }

  private newTxProducer(partition: number): Producer {
    return this.kafka.producer({
      transactionalId: `${this.groupId}-${this.enrichedTopic}-${partition}`,
      idempotent: true,
      maxInFlightRequests: 1,
      createPartitioner: Partitioners.DefaultPartitioner,
    });
  }

  /** A new producer on the partition's transactional id in place of the current one (stuck after an
   * unanswered commit or abort); its InitProducerId completes the transaction left open. Undefined when the
   * partition is not owned any more: a re-init would fence its new owner. */
  private async reopenTransactions(partition: number): Promise<TxProducer | undefined> {
    const old = this.txProducers.get(partition);
    if (old === undefined || !this.owned.has(partition)) return undefined;
    this.stuck.add(partition); // until replaced: the next attempt settles first, whatever this one throws
    await old.disconnect().catch(() => undefined);
    const fresh = this.newTxProducer(partition);
    try {
      await fresh.connect();
      await (await fresh.transaction()).abort();
    } catch (error) {
      await fresh.disconnect().catch(() => undefined);
      throw error;
    }
    if (this.txProducers.get(partition) !== old) {
      await fresh.disconnect().catch(() => undefined); // closed meanwhile (revoked)
      return undefined;
    }
    this.txProducers.set(partition, fresh);
    this.stuck.delete(partition);
    return fresh;
  }

  private async committedOffset(partition: number): Promise<bigint | undefined> {
    const admin = this.kafka.admin();
    await admin.connect();
    try {
      const [committed] = await admin.fetchOffsets({ groupId: this.groupId, topics: [this.enrichedTopic] });
      const found = committed?.partitions.find((p) => p.partition === partition);
      return found === undefined || BigInt(found.offset) < 0n ? undefined : BigInt(found.offset);
    } finally {
      await admin.disconnect().catch(() => undefined);
    }
  }

  /** exactly-once: the consumed offset alone in a transaction (a dropped turn); false when not committed. */
  private async commitInTransaction(turn: Turn): Promise<boolean> {
    const result = await runTransaction(this.txPartition(turn.partition), turn.offset, async () => undefined);
    if (result === 'fenced') await this.closeTransactions([turn.partition]);
    return result === 'committed';
  }

  /** exactly-once: the response and the consumed offset in one transaction; 'fenced' when the partition is
   * another worker's (nothing of this turn is visible, or its new owner settles it). Retried while Kafka is
   * unavailable; a commit in doubt is settled, and the response sent again only if it was aborted. */
  private async sendInTransaction(
    turn: Turn,
    response: AgentResponse,
    headers: IHeaders | undefined,
  ): Promise<AgentResponse | undefined | 'fenced' | 'dropped'> {
    for (;;) {
      const reply = response;
      let result;
      try {
        result = await runTransaction(this.txPartition(turn.partition), turn.offset, async (txn) => {
          await txn.send({
            topic: this.responsesTopic,
            messages: [{ key: reply.threadId, value: JSON.stringify(reply), headers }],
          });
        });
      } catch (error) {
        if (!isTooLarge(error)) throw error;
        if (response.finishReason !== FAILED) {
          this.log('error', 'the response is too large for Kafka: answering a failed turn', { requestId: turn.requestId });
          response = failedResponse(turn);
          continue;
        }
        this.log('error', 'the failed-turn response is too large for Kafka too: the turn is dropped', { requestId: turn.requestId });
        return (await this.commitInTransaction(turn)) ? 'dropped' : 'fenced';
      }
      if (result === 'committed') return response;
      if (result === 'given-up') return undefined;
      this.log('warn', 'transaction fenced: another worker owns the partition now; the turn is dropped', {
        requestId: turn.requestId,
        partition: turn.partition,
      });
      await this.closeTransactions([turn.partition]);
      return 'fenced';
    }
  }

  private async onRecord(
    topic: string,
    partition: number,
    offset: string,
    value: Buffer | null,
    headers: IHeaders | undefined,
    heartbeat: () => Promise<void>,
  ): Promise<void> {
    if (this.giveUp.signal.aborted) return;
    await this.warmups.get(partition);
    const floor = this.floors.get(partition);
    if (floor !== undefined && BigInt(offset) < floor) return; // answered and committed by the previous owner
    let event: EnrichedRequest;
    try {
      const parsed: unknown = JSON.parse(value?.toString('utf8') ?? '');
      const problem = enrichedProblem(parsed);
      if (problem !== undefined) throw new Error(problem);
      event = parsed as EnrichedRequest;
    } catch (error) {
      // The service never writes one; the worker has no dead-letter topic: log it and go on.
      this.stats.invalid += 1;
      this.log('warn', 'skipped a record that is not an EnrichedRequest', { topic, partition, offset, error: String(error) });
      this.emit('invalid', { partition, offset });
      await this.commit(partition, offset);
      return;
    }
    if (this.seen.has(partition, event.eventId)) {
      this.stats.duplicates += 1;
      this.emit('duplicate', { partition, offset, eventId: event.eventId, requestId: event.requestId });
      await this.commit(partition, offset);
      return;
    }
    // The turn's span (a child of the request's traceparent; a no-op without @opentelemetry/api).
    const span = this.tracing(headers, {
      'messaging.destination.name': topic,
      'messaging.kafka.partition': partition,
      'messaging.kafka.offset': Number(offset),
      'messaging.message.id': event.requestId,
    });
    let failure: string | undefined;
    try {
      failure = await this.answer(event, partition, offset, headers, heartbeat, span);
    } catch (error) {
      failure = String(error);
      throw error;
    } finally {
      span.end(failure);
    }
  }

  /** Answers one enriched request; returns why the turn failed, if it did. */
  private async answer(
    event: EnrichedRequest,
    partition: number,
    offset: string,
    received: IHeaders | undefined,
    heartbeat: () => Promise<void>,
    span: TurnSpan,
  ): Promise<string | undefined> {
    const answered = await span.run(() => this.respond(event, partition, offset, heartbeat));
    const turn = answered.turn;
    let response = answered.response;
    if (response === undefined) return 'given up at shutdown'; // not sent, not committed
    const headers = span.headers(received) as IHeaders | undefined; // the turn span's traceparent in place
    const sent = this.exactlyOnce
      ? await this.sendInTransaction(turn, response, headers)
      : await this.send(turn, response, headers);
    if (sent === undefined || sent === 'fenced') return sent === 'fenced' ? 'fenced' : 'given up at shutdown';
    if (!this.exactlyOnce) await this.commit(partition, offset);
    if (sent === 'dropped') {
      this.seen.add(partition, event.eventId);
      this.stats.failed += 1;
      const failure = 'even the failed-turn response is too large for Kafka';
      this.emit('dropped', { turn, failure });
      return failure;
    }
    response = sent;
    this.seen.add(partition, event.eventId);
    if (response.finishReason === FAILED) {
      this.stats.failed += 1;
      const failure =
        answered.failure ??
        (response === answered.response ? 'the handler answered finishReason "error"' : 'the response is too large for Kafka');
      this.emit('failed', { turn, response, failure });
      return failure;
    }
    this.stats.answered += 1;
    this.emit('answered', { turn, response });
    return undefined;
  }

  /** The handler's answer, or a failed turn; undefined when the worker gave the turn up (shutdown). The turn's
   * signal is its own: aborted when the handler outlives handlerTimeoutMs and when the worker gives it up. */
  private async respond(
    event: EnrichedRequest,
    partition: number,
    offset: string,
    heartbeat: () => Promise<void>,
  ): Promise<{ turn: Turn; response: AgentResponse | undefined; failure?: string }> {
    // A long model call must not cost the group membership: KafkaJS heartbeats only between records.
    const beat = setInterval(() => void heartbeat().catch(() => undefined), HEARTBEAT_EVERY_MS);
    try {
      const { turn, outcome } = await respond(this.handler, (signal) => new Turn(event, partition, offset, signal), {
        timeoutMs: this.options.handlerTimeoutMs,
        giveUp: this.giveUp.signal,
        onRetry: ({ attempt, delayMs, error }) => {
          this.stats.retried += 1;
          this.log('warn', 'the handler asked to retry later: backing off, then the same turn again', {
            requestId: event.requestId,
            attempt,
            delayMs,
            error,
          });
          this.emit('retrying', { requestId: event.requestId, attempt, delayMs, error });
        },
      });
      if (outcome.kind === 'gave-up') return { turn, response: undefined };
      if (outcome.kind === 'failed') {
        this.log('error', 'the handler failed: answering a failed turn', {
          requestId: turn.requestId,
          threadId: turn.threadId,
          error: outcome.failure,
        });
        return { turn, response: outcome.response, failure: outcome.failure };
      }
      return { turn, response: outcome.response };
    } finally {
      clearInterval(beat);
    }
  }

  /** Sends and waits for the acknowledgement, retrying while Kafka is unavailable; a response too large for
   * Kafka is answered as a failed turn instead. Returns what was sent (undefined if given up at shutdown). */
  private async send(
    turn: Turn,
    response: AgentResponse,
    headers: IHeaders | undefined,
  ): Promise<AgentResponse | undefined | 'dropped'> {
    for (let attempt = 0; ; attempt += 1) {
      try {
        await this.producer.send({
          topic: this.responsesTopic,
          acks: -1,
          messages: [{ key: response.threadId, value: JSON.stringify(response), headers }],
        });
        return response;
      } catch (error) {
        if (isTooLarge(error)) {
          if (response.finishReason !== FAILED) {
            this.log('error', 'the response is too large for Kafka: answering a failed turn', { requestId: turn.requestId });
            response = failedResponse(turn);
            continue;
          }
          // Never a loop: the failed turn (the input alone) does not fit either; redelivering would call the
          // handler again and again. The turn is committed unanswered (as the Python SDK drops it).
          this.log('error', 'the failed-turn response is too large for Kafka too: the turn is dropped', { requestId: turn.requestId });
          return 'dropped';
        }
        if (!isOutage(error)) throw error;
        if (this.giveUp.signal.aborted) return undefined;
        const delay = backoff(attempt);
        this.log('warn', 'Kafka unavailable: retrying the response', { requestId: turn.requestId, delayMs: Math.round(delay), error: String(error) });
        await sleep(delay);
      }
    }
  }

  /**
   * Reads the newest `readBackPerPartition` records of the responses topic's `partitions` and marks their
   * requestIds answered. Those partitions hold the answers to the owned enriched partitions (same key, same
   * partitioner, equal counts). Best effort: on a timeout or an error the worker goes on with what it read.
   */
  private async readBack(partitions: number[]): Promise<void> {
    const perPartition = this.options.readBackPerPartition ?? 1000;
    if (perPartition <= 0 || partitions.length === 0) return;
    const started = Date.now();
    const topic = this.responsesTopic;
    const admin = this.kafka.admin();
    let found = 0;
    try {
      await admin.connect();
      const targets = new Map<number, { start: bigint; end: bigint }>();
      for (const o of await admin.fetchTopicOffsets(topic)) {
        const high = BigInt(o.high);
        const low = BigInt(o.low);
        const start = high - BigInt(perPartition) > low ? high - BigInt(perPartition) : low;
        if (partitions.includes(o.partition) && high > low) targets.set(o.partition, { start, end: high });
      }
      if (targets.size === 0) return;
      // A throwaway group (KafkaJS has no manual assignment), deleted afterwards.
      const groupId = `${this.groupId}.read-back.${randomUUID()}`;
      const reader = this.kafka.consumer({ groupId });
      const remaining = new Set(targets.keys());
      let finished!: () => void;
      const done = new Promise<void>((resolve) => {
        finished = resolve;
      });
      try {
        await reader.connect();
        await reader.subscribe({ topics: [topic], fromBeginning: true });
        await reader.run({
          autoCommit: false,
          eachBatch: async ({ batch }) => {
            const target = targets.get(batch.partition);
            if (target === undefined) return;
            for (const message of batch.messages) {
              const offset = BigInt(message.offset);
              if (offset < target.start || offset >= target.end) continue;
              const id = requestIdOf(message.value);
              if (id !== undefined) {
                this.seen.add(batch.partition, id);
                found += 1;
              }
            }
            if (BigInt(batch.lastOffset()) >= target.end - 1n) {
              remaining.delete(batch.partition);
              if (remaining.size === 0) finished();
            }
          },
        });
        for (const [partition, { start }] of targets) reader.seek({ topic, partition, offset: start.toString() });
        const timeout = this.options.readBackTimeoutMs ?? 30_000;
        let timer: NodeJS.Timeout | undefined;
        const late = new Promise<'late'>((resolve) => {
          timer = setTimeout(() => resolve('late'), timeout);
        });
        if ((await Promise.race([done.then(() => 'done' as const), late])) === 'late') {
          this.log('warn', 'read-back of answered requestIds timed out: going on with what was read', {
            partitions: [...remaining],
            timeoutMs: timeout,
          });
        }
        clearTimeout(timer);
      } finally {
        await reader.disconnect().catch(() => undefined);
        await admin.deleteGroups([groupId]).catch(() => undefined);
      }
    } catch (error) {
      // Said loudly: without it a restart answers again what the previous owner answered but did not commit.
      // It needs more than docs/security.md's worker ACLs: Read and Describe on the responses topic, Read and
      // Delete on the consumer groups `{groupId}.read-back.` (prefixed).
      this.log('warn', 'WARNING: the read-back of answered requestIds is OFF for these partitions: a turn answered but not committed before a restart or rebalance will be answered again (a second model call). It needs Read on the responses topic and Read/Delete on the groups prefixed `{groupId}.read-back.`; readBackPerPartition: 0 turns it off quietly', {
        partitions,
        error: String(error),
      });
      this.emit('read-back-off', { partitions, error: String(error) });
    } finally {
      await admin.disconnect().catch(() => undefined);
      this.log('info', 'read back answered requestIds', { partitions, found, ms: Date.now() - started });
    }
  }
}
