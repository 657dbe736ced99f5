// AgentWorker: agent.requests.enriched in, agent.responses out, around the user's async handler. The same
// behaviour as the Python SDK's worker.AgentWorker (docs/worker.md, "What a worker must get right"), on any client of
// the seam (src/client.ts; @platformatic/kafka by default).
import { EventEmitter } from 'node:events';
import { readFileSync } from 'node:fs';

import type { InRecord, KafkaClient, KafkaClientFactory, TransactionalProducer } from './client.js';
import { enrichedProblem, type AgentResponse, type EnrichedRequest } from './events.js';
import { platformaticClient } from './platformatic.js';
import { respond, type Handler } from './respond.js';
import { connectionFromEnv, type ConnectionOptions, type Env } from './settings.js';
import { loadTracing, tracingOff, type Tracing, type TurnSpan } from './tracing.js';
import { isOutage, runTransaction, type Headers, type TxPartition, type TxProducer } from './transactions.js';
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
  /** The group's session timeout: a killed worker's partitions move on after this long (default: the client's,
   * 60 s on @platformatic/kafka, 30 s on KafkaJS). */
  sessionTimeoutMs?: number;
  /** How long a Kafka request waits for its answer before it counts as an outage (default 30 s, both
   * clients').
   * Under exactly-once a commit left unanswered is settled before anything is sent again. */
  requestTimeoutMs?: number;
  /** How often the worker heartbeats to its group (default 3 s). */
  heartbeatIntervalMs?: number;
  /** Partitions read at the same time (default 4). */
  partitionsConsumedConcurrently?: number;
  /** Threads with turns in flight per partition (default 32, as the Python SDK's `max_concurrent_turns`, which
   * counts threads): different threads at the same time, one thread's turns in order. A thread holds its room
   * until its last queued turn ends, so the turns waiting behind a hung turn take no room from other threads.
   * The enriched offset is committed only past the prefix of turns done; under exactly-once the answers are
   * sent (each in its transaction) in offset order. */
  maxConcurrentTurnsPerPartition?: number;
  /** Records read and not yet done per partition (running, or queued behind their thread's turn; default 100,
   * as the Python SDK's `max_batch_records`): past it the partition's next record waits (heartbeating). The
   * memory bound on what queues behind a hung turn. */
  maxPendingRecordsPerPartition?: number;
  /** The Kafka client: `platformaticClient` (default, @platformatic/kafka), `kafkajsClient` (KafkaJS 2.2.4; it can
   * lose an acknowledged answer under at-least-once when a send times out: see the README's client note) or
   * `memoryClient(broker)` (`@message-history/worker/testing`). */
  client?: KafkaClientFactory;
  /** The backoff before a RetryLater turn's next attempt: doubling from this (default 1 s) ... */
  retryLaterInitialMs?: number;
  /** ... up to this (default 60 s); a RetryLater's `afterMs` is the floor. */
  retryLaterMaxMs?: number;
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

  private readonly client: KafkaClient;
  private readonly maxInFlight: number;
  private readonly maxPending: number;
  /** Per owned partition: its turns in flight and what is committed (see Lane). */
  private readonly lanes = new Map<number, Lane>();
  /** Per partition and thread: the tail of the thread's turns (one thread's turns in order) and the Lane whose
   * room the thread holds (released when the tail ends with nothing queued behind it). */
  private readonly threads = new Map<string, { tail: Promise<void>; lane: Lane }>();
  private readonly inFlight = new Set<Promise<void>>();
  private delivering = true;
  private readonly seen: SeenEvents;
  private readonly log: Logger;
  private readonly giveUp = new AbortController();
  private readonly warmups = new Map<number, Promise<void>>();
  private owned = new Set<number>();
  private readonly exactlyOnce: boolean;
  /** exactly-once: a transactional producer per owned partition, and the offset committed when it was opened. */
  private readonly txProducers = new Map<number, TransactionalProducer>();
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
    this.client = (options.client ?? platformaticClient)({
      brokers: options.brokers,
      ...(options.ssl === undefined ? {} : { ssl: options.ssl }),
      ...(options.sasl === undefined ? {} : { sasl: options.sasl }),
      clientId: options.clientId ?? options.groupId,
      groupId: options.groupId,
      ...(options.sessionTimeoutMs === undefined ? {} : { sessionTimeoutMs: options.sessionTimeoutMs }),
      ...(options.heartbeatIntervalMs === undefined ? {} : { heartbeatIntervalMs: options.heartbeatIntervalMs }),
      ...(options.requestTimeoutMs === undefined ? {} : { requestTimeoutMs: options.requestTimeoutMs }),
    });
    this.maxInFlight = options.maxConcurrentTurnsPerPartition ?? 32;
    if (!Number.isInteger(this.maxInFlight) || this.maxInFlight < 1) {
      throw new RangeError('maxConcurrentTurnsPerPartition must be at least 1');
    }
    this.maxPending = options.maxPendingRecordsPerPartition ?? 100;
    if (!Number.isInteger(this.maxPending) || this.maxPending < 1) {
      throw new RangeError('maxPendingRecordsPerPartition must be at least 1');
    }
    this.exactlyOnce = options.processingGuarantee === 'exactly-once';
    if (this.exactlyOnce && this.client.transactional === undefined) {
      throw new Error("processingGuarantee 'exactly-once' needs a client with transactions (kafkajsClient, platformaticClient)");
    }
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
    const crashed = this.client.crashed;
    this.tracing = this.options.tracing === false ? tracingOff : await loadTracing();
    await this.client.connect();
    const stopped = new Promise<void>((resolve) => this.once('stopped', () => resolve()));
    await this.client.consume({
      topic: this.enrichedTopic,
      partitionsConcurrently: this.options.partitionsConsumedConcurrently ?? 4,
      onAssignment: (partitions) => this.onAssignment(partitions),
      eachRecord: (record, heartbeat) => this.onRecord(record, heartbeat),
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
      this.delivering = false; // records read from now on are left for the next owner
      const settled = this.settled();
      if ((await Promise.race([settled.then(() => 'done' as const), late])) === 'late') {
        this.log('warn', 'shutdown grace over: giving up the turns in flight (not committed)', { graceMs: grace });
        this.giveUp.abort();
        await this.settled();
      }
      clearTimeout(timer);
      await this.client.leave();
      await this.closeTransactions([...this.txProducers.keys()]);
      await this.client.close();
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

  /** Every turn in flight ended (answered, failed, given up). */
  private async settled(): Promise<void> {
    while (this.inFlight.size > 0) await Promise.allSettled([...this.inFlight]);
  }

  private onAssignment(partitions: number[]): void {
    const assigned = new Set(partitions);
    const fresh = [...assigned].filter((p) => !this.owned.has(p));
    const gone = [...this.owned].filter((p) => !assigned.has(p));
    this.owned = assigned;
    for (const partition of gone) {
      this.lanes.get(partition)?.revoke();
      this.lanes.delete(partition);
    }
    void this.closeTransactions(gone);
    // Synchronously here, before the first record of the new assignment: each turn awaits its partition's.
    const warmup = Promise.all([this.readBack(fresh), this.openTransactions(fresh)]).then(() => undefined);
    for (const partition of fresh) this.warmups.set(partition, warmup);
    this.emit('assigned', { partitions: [...assigned].sort((a, b) => a - b), readBack: fresh });
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
    for (const [partition, offset] of await this.client.committed(this.enrichedTopic)) {
      if (partitions.includes(partition)) this.floors.set(partition, offset);
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

  private newTxProducer(partition: number): TransactionalProducer {
    return this.client.transactional!(`${this.groupId}-${this.enrichedTopic}-${partition}`);
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
    return (await this.client.committed(this.enrichedTopic)).get(partition);
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
    headers: Headers | undefined,
  ): Promise<AgentResponse | undefined | 'fenced' | 'dropped'> {
    for (;;) {
      const reply = response;
      let result;
      try {
        result = await runTransaction(this.txPartition(turn.partition), turn.offset, async (txn) => {
          await txn.send({
            topic: this.responsesTopic,
            messages: [{ key: reply.threadId, value: JSON.stringify(reply), ...(headers ? { headers } : {}) }],
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

  /** One record of the enriched topic: its turn is scheduled (behind the turns of its thread; a thread new to
   * the partition waits for one of its `maxConcurrentTurnsPerPartition` rooms, any record for one of its
   * `maxPendingRecordsPerPartition` places) and this resolves, so the next record of the partition comes while
   * it runs. */
  private async onRecord(record: InRecord, heartbeat: () => Promise<void>): Promise<void> {
    const { partition, offset } = record;
    if (!this.delivering || this.giveUp.signal.aborted) return;
    await this.warmups.get(partition);
    const floor = this.floors.get(partition);
    if (floor !== undefined && BigInt(offset) < floor) return; // answered and committed by the previous owner
    let lane = this.lanes.get(partition);
    if (lane?.failure !== undefined) {
      // a turn of this partition met an error: the client redelivers from the committed offset
      const failure = lane.failure;
      lane.revoke();
      this.lanes.delete(partition);
      throw failure;
    }
    if (lane === undefined || BigInt(offset) <= lane.last) {
      lane?.revoke(); // redelivered from the committed offset: the old lane's late turns commit nothing
      lane = new Lane(partition, this.maxInFlight, this.maxPending, (next) => this.commitPrefix(lane!, next));
      this.lanes.set(partition, lane);
    }
    let event: EnrichedRequest | undefined;
    let invalid: string | undefined;
    try {
      const parsed: unknown = JSON.parse(record.value?.toString('utf8') ?? '');
      invalid = enrichedProblem(parsed);
      if (invalid === undefined) event = parsed as EnrichedRequest;
    } catch (error) {
      invalid = String(error);
    }
    const key = event === undefined ? undefined : `${partition}\u0000${event.threadId}`;
    const owner = lane;
    await owner.pending.take(heartbeat);
    if (!this.delivering || owner.revoked || this.lanes.get(partition) !== owner) return owner.pending.leave();
    // A thread with a turn of this lane in flight or queued holds a room already: this record queues behind it.
    // A thread new to the lane (or whose tail is an old lane's) takes a room, held until its queue is empty.
    const running = key === undefined ? undefined : this.threads.get(key);
    const holdsRoom = key !== undefined && running?.lane === owner;
    if (key !== undefined && !holdsRoom) {
      await owner.rooms.take(heartbeat);
      if (!this.delivering || owner.revoked || this.lanes.get(partition) !== owner) {
        owner.rooms.leave();
        return owner.pending.leave();
      }
    }
    const slot = owner.deliver(BigInt(offset));
    // behind the thread's tail (an old lane's too: one thread's turns in order across a redelivery)
    const previous = (key === undefined ? undefined : this.threads.get(key)?.tail) ?? Promise.resolve();
    const turn = previous
      .then(() => this.process(owner, slot, record, event, invalid))
      .catch((error: unknown) => {
        slot.release(false);
        owner.fail(error);
        this.log('error', 'a turn met an error: its partition is read again from the committed offset', {
          partition,
          offset,
          error: String(error),
        });
      });
    const tail: Promise<void> = turn.finally(() => {
      owner.pending.leave();
      this.inFlight.delete(tail);
      if (key !== undefined && this.threads.get(key)?.tail === tail) {
        this.threads.delete(key); // the thread's queue is empty: its room goes to the next thread waiting
        owner.rooms.leave();
      }
    });
    if (key !== undefined) this.threads.set(key, { tail, lane: owner });
    this.inFlight.add(tail);
  }

  /** at-least-once: commits the partition's done prefix (retried while Kafka is unavailable). */
  private async commitPrefix(lane: Lane, next: bigint): Promise<void> {
    for (let attempt = 0; !lane.revoked; attempt += 1) {
      try {
        await this.client.commit(this.enrichedTopic, lane.partition, next);
        return;
      } catch (error) {
        if (!isOutage(error) || this.giveUp.signal.aborted) {
          this.log('warn', 'offset commit refused: the turns past it are answered again by the next owner', {
            partition: lane.partition,
            offset: next.toString(),
            error: String(error),
          });
          return;
        }
        await sleep(backoff(attempt));
      }
    }
  }

  /** A record that needs no answer (not an EnrichedRequest, or answered already): committed in its turn. */
  private async skip(lane: Lane, slot: Slot, offset: string): Promise<void> {
    if (!this.exactlyOnce) return lane.settle(BigInt(offset));
    if (!(await slot.previous) || lane.revoked) return slot.release(false);
    await this.client.commit(this.enrichedTopic, lane.partition, BigInt(offset) + 1n);
    slot.release(true);
  }

  private async process(
    lane: Lane,
    slot: Slot,
    record: InRecord,
    event: EnrichedRequest | undefined,
    invalid: string | undefined,
  ): Promise<void> {
    const { topic, partition, offset, headers } = record;
    if (event === undefined) {
      // The service never writes one; the worker has no dead-letter topic: log it and go on.
      this.stats.invalid += 1;
      this.log('warn', 'skipped a record that is not an EnrichedRequest', { topic, partition, offset, error: invalid });
      this.emit('invalid', { partition, offset });
      return this.skip(lane, slot, offset);
    }
    if (this.seen.has(partition, event.eventId)) {
      this.stats.duplicates += 1;
      this.emit('duplicate', { partition, offset, eventId: event.eventId, requestId: event.requestId });
      return this.skip(lane, slot, offset);
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
      failure = await this.answer(event, lane, slot, offset, headers, span);
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
    lane: Lane,
    slot: Slot,
    offset: string,
    received: Headers | undefined,
    span: TurnSpan,
  ): Promise<string | undefined> {
    const partition = lane.partition;
    const answered = await span.run(() => this.respond(event, partition, offset));
    const turn = answered.turn;
    let response = answered.response;
    if (response === undefined) {
      slot.release(false);
      return 'given up at shutdown'; // not sent, not committed
    }
    const headers = span.headers(received); // the turn span's traceparent in place
    let sent: AgentResponse | undefined | 'fenced' | 'dropped';
    if (this.exactlyOnce) {
      // in offset order: a transaction commits its offset, so every record before it is settled first
      if (!(await slot.previous) || lane.revoked) {
        slot.release(false);
        return 'not sent: an earlier record of the partition was not committed (left for the next owner)';
      }
      try {
        sent = await this.sendInTransaction(turn, response, headers);
      } finally {
        slot.release(sent !== undefined && sent !== 'fenced');
      }
    } else {
      sent = await this.send(turn, response, headers);
    }
    if (sent === undefined || sent === 'fenced') return sent === 'fenced' ? 'fenced' : 'given up at shutdown';
    this.seen.add(partition, event.eventId);
    if (!this.exactlyOnce) await lane.settle(BigInt(offset));
    if (sent === 'dropped') {
      this.stats.failed += 1;
      const failure = 'even the failed-turn response is too large for Kafka';
      this.emit('dropped', { turn, failure });
      return failure;
    }
    response = sent;
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
  ): Promise<{ turn: Turn; response: AgentResponse | undefined; failure?: string }> {
    {
      const { turn, outcome } = await respond(this.handler, (signal) => new Turn(event, partition, offset, signal), {
        timeoutMs: this.options.handlerTimeoutMs,
        giveUp: this.giveUp.signal,
        ...(this.options.retryLaterInitialMs === undefined ? {} : { retryInitialMs: this.options.retryLaterInitialMs }),
        ...(this.options.retryLaterMaxMs === undefined ? {} : { retryMaxMs: this.options.retryLaterMaxMs }),
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
    }
  }

  /** Sends and waits for the acknowledgement, retrying while Kafka is unavailable; a response too large for
   * Kafka is answered as a failed turn instead. Returns what was sent (undefined if given up at shutdown). */
  private async send(
    turn: Turn,
    response: AgentResponse,
    headers: Headers | undefined,
  ): Promise<AgentResponse | undefined | 'dropped'> {
    for (let attempt = 0; ; attempt += 1) {
      try {
        await this.client.send(this.responsesTopic, [
          { key: response.threadId, value: JSON.stringify(response), ...(headers ? { headers } : {}) },
        ]);
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
    let found = 0;
    try {
      const targets = new Map<number, { start: bigint; end: bigint }>();
      for (const o of await this.client.offsets(topic)) {
        const start = o.high - BigInt(perPartition) > o.low ? o.high - BigInt(perPartition) : o.low;
        if (partitions.includes(o.partition) && o.high > o.low) targets.set(o.partition, { start, end: o.high });
      }
      if (targets.size === 0) return;
      const timeout = this.options.readBackTimeoutMs ?? 30_000;
      const remaining = await this.client.readRange(
        topic,
        targets,
        (partition, value) => {
          const id = requestIdOf(value);
          if (id !== undefined) {
            this.seen.add(partition, id);
            found += 1;
          }
        },
        timeout,
      );
      if (remaining.length > 0) {
        this.log('warn', 'read-back of answered requestIds timed out: going on with what was read', {
          partitions: remaining,
          timeoutMs: timeout,
        });
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
      this.log('info', 'read back answered requestIds', { partitions, found, ms: Date.now() - started });
    }
  }
}

/** A record's place in its partition's send order (exactly-once): `previous` resolves once every earlier
 * record is settled (true: committed; false: not, so nothing after it may be committed). */
interface Slot {
  previous: Promise<boolean>;
  release(committed: boolean): void;
}

/**
 * One owned partition's turns: the offsets delivered and not yet done, the commit of the done prefix
 * (at-least-once), the send order (exactly-once), and the cap of turns in flight. A new Lane replaces it after
 * a redelivery from the committed offset (an error, a rebalance): the old one is revoked and commits nothing.
 */
class Lane {
  last = -1n;
  revoked = false;
  failure: unknown;
  /** Threads with turns in flight or queued (the cap, `maxConcurrentTurnsPerPartition`). */
  readonly rooms: Gate;
  /** Records read and not done (`maxPendingRecordsPerPartition`). */
  readonly pending: Gate;
  private readonly undone: bigint[] = [];
  private readonly done = new Set<bigint>();
  private committedNext = -1n;
  private commits: Promise<void> = Promise.resolve();
  private order: Promise<boolean> = Promise.resolve(true);

  constructor(
    readonly partition: number,
    maxThreads: number,
    maxPending: number,
    private readonly commit: (next: bigint) => Promise<void>,
  ) {
    this.rooms = new Gate(maxThreads);
    this.pending = new Gate(maxPending);
  }

  deliver(offset: bigint): Slot {
    this.undone.push(offset);
    this.last = offset;
    const previous = this.order;
    let release!: (committed: boolean) => void;
    this.order = new Promise<boolean>((resolve) => {
      release = resolve;
    }).then((ok) => ok);
    const own = this.order;
    let released = false;
    return {
      previous: previous.then((ok) => ok && !this.revoked),
      release: (committed) => {
        if (released) return;
        released = true;
        // a record after one not committed is not committed either
        void previous.then((ok) => release(ok && committed));
        void own;
      },
    };
  }

  /** at-least-once: `offset` is answered (or needs no answer); commits the prefix of done offsets. */
  settle(offset: bigint): Promise<void> {
    this.done.add(offset);
    let next: bigint | undefined;
    while (this.undone.length > 0 && this.done.has(this.undone[0]!)) {
      const first = this.undone.shift()!;
      this.done.delete(first);
      next = first + 1n;
    }
    if (next === undefined || this.revoked) return this.commits;
    const target = next;
    this.commits = this.commits.then(async () => {
      if (this.revoked || target <= this.committedNext) return;
      await this.commit(target);
      this.committedNext = target;
    });
    return this.commits;
  }

  fail(error: unknown): void {
    this.failure ??= error;
  }

  revoke(): void {
    this.revoked = true;
    this.rooms.open();
    this.pending.open();
  }
}

/** A counting bound: `take` waits (heartbeating: the group must keep this member) while `max` are taken;
 * `leave` hands the place to the next waiting (or frees it); `open` lets every waiting one through (a
 * revoked lane: they see it revoked and give their place back). */
class Gate {
  private taken = 0;
  private readonly waiting: (() => void)[] = [];

  constructor(private readonly max: number) {}

  async take(heartbeat: () => Promise<void>): Promise<void> {
    if (this.taken < this.max) {
      this.taken += 1;
      return;
    }
    const beat = setInterval(() => void heartbeat().catch(() => undefined), HEARTBEAT_EVERY_MS);
    try {
      await new Promise<void>((resolve) => this.waiting.push(resolve));
    } finally {
      clearInterval(beat);
    }
  }

  leave(): void {
    const next = this.waiting.shift();
    if (next !== undefined) next();
    else this.taken -= 1;
  }

  open(): void {
    for (const resolve of this.waiting.splice(0)) {
      this.taken += 1; // each one let through holds a place until it leaves
      resolve();
    }
  }
}
