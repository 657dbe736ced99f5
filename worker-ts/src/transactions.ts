// exactly-once: one turn's transaction (its response and its consumed offset), and the settling of a commit
// whose outcome is unknown. No Kafka client here: the worker passes its KafkaJS producers as `TxPartition`.
//
// Why a commit is settled, never guessed: EndTxn that gets no answer (a timeout, a lost connection) may have
// committed. Sending the turn again in a new transaction would then show a read_committed reader the response
// twice. KafkaJS cannot retry it either: its transaction state machine stays in COMMITTING after a failed
// `commit()` (and in ABORTING after a failed `abort()`), where `commit`, `abort` and a new `transaction()` are
// refused. So the partition's producer is replaced by a new one on the same transactional id: its
// InitProducerId completes the transaction left open (the broker finishes a commit it received, aborts one
// it did not), and then the group's committed offset of the input partition, which was part of that
// transaction, says whether it landed. Only a transaction known aborted has its response sent again.

/** Kafka being unavailable (retry until it is back), as opposed to a refusal (raise). */
export function isOutage(error: unknown): boolean {
  const e = error as { retriable?: boolean; name?: string; cause?: unknown } | null;
  if (!e) return false;
  if (e.retriable === true) return true;
  if (
    [
      'KafkaJSConnectionError',
      'KafkaJSConnectionClosedError',
      'KafkaJSRequestTimeoutError',
      'KafkaJSNumberOfRetriesExceeded',
      'KafkaJSBrokerNotFound',
      // a coordinator not found (yet): the broker restarting or frozen, not a refusal
      'KafkaJSGroupCoordinatorNotFound',
      'KafkaJSNoBrokerAvailableError',
      'KafkaJSTimeout',
    ].includes(e.name ?? '')
  ) {
    return true;
  }
  // KafkaJS' Broker throws a plain Error while it reconnects (a broker restarting)
  if ((error as Error).message === 'Broker not connected') return true;
  return e.cause !== undefined && e.cause !== error && isOutage(e.cause);
}

/** Another producer holds this partition's transactional id now: this worker lost the partition. */
export function isFenced(error: unknown): boolean {
  const e = error as { type?: string; cause?: unknown } | null;
  if (!e) return false;
  return (
    ['INVALID_PRODUCER_EPOCH', 'PRODUCER_FENCED', 'TRANSACTIONAL_ID_AUTHORIZATION_FAILED'].includes(e.type ?? '') ||
    (e.cause !== undefined && e.cause !== error && isFenced(e.cause))
  );
}

/** Record headers, as KafkaJS' IHeaders. */
export type Headers = Record<string, Buffer | string | (Buffer | string)[] | undefined>;

/** The part of a KafkaJS transaction a turn uses. */
export interface Tx {
  send(record: { topic: string; messages: { key: string; value: string; headers?: Headers }[] }): Promise<unknown>;
  sendOffsets(offsets: {
    consumerGroupId: string;
    topics: { topic: string; partitions: { partition: number; offset: string }[] }[];
  }): Promise<void>;
  commit(): Promise<void>;
  abort(): Promise<void>;
}

export interface TxProducer {
  transaction(): Promise<Tx>;
}

/** One owned input partition's transactional producer, as the worker holds it. */
export interface TxPartition {
  groupId: string;
  topic: string;
  partition: number;
  /** The partition's producer; undefined once the partition is not this worker's (revoked, fenced). */
  producer(): TxProducer | undefined;
  /** Replaces the producer by a new one on the same transactional id, initialised: its InitProducerId
   * completes the transaction left open. Undefined when the partition is not this worker's any more (a
   * re-init would fence its new owner). */
  reopen(): Promise<TxProducer | undefined>;
  /** A reopen began and did not finish: the producer is stuck, a transaction of it may be in doubt. */
  stuck(): boolean;
  /** The group's committed offset of the input partition (undefined: none). */
  committed(): Promise<bigint | undefined>;
  /** The worker gave its turns up (shutdown grace over): stop waiting. */
  givenUp(): boolean;
  /** Waits before attempt `attempt + 1` (a backoff). */
  pause(attempt: number): Promise<void>;
  log(level: 'warn' | 'error', message: string, fields: Record<string, unknown>): void;
}

/** `committed`: the records and the offset are visible; `fenced`: nothing of it is this worker's to settle
 * (another owner completes it); `given-up`: shutdown, not known (the next owner settles it). */
export type TxResult = 'committed' | 'fenced' | 'given-up';

/** How a transaction whose end went unanswered ended: after `reopen`, the committed offset tells. */
export async function settle(tx: TxPartition, next: bigint): Promise<'committed' | 'aborted' | 'fenced' | 'given-up'> {
  for (let attempt = 0; ; attempt += 1) {
    if (tx.givenUp()) return 'given-up';
    try {
      if ((await tx.reopen()) === undefined) return 'fenced';
      const committed = await tx.committed();
      return committed !== undefined && committed >= next ? 'committed' : 'aborted';
    } catch (error) {
      if (!isOutage(error)) throw error;
      tx.log('warn', 'Kafka unavailable: settling the transaction in doubt again', {
        partition: tx.partition,
        error: String(error),
      });
      await tx.pause(attempt);
    }
  }
}

/**
 * One transaction: `fill` sends the records on it, then the consumed `offset` goes in and it is committed.
 * Retried while Kafka is unavailable; a commit (or an abort) without an answer is settled first, and the
 * records are sent again only if it was aborted. A refusal other than fencing is thrown once the transaction
 * is known aborted (a record too large for Kafka, say: the caller answers otherwise).
 */
export async function runTransaction(
  tx: TxPartition,
  offset: string,
  fill: (txn: Tx) => Promise<void>,
): Promise<TxResult> {
  const next = BigInt(offset) + 1n;
  for (let attempt = 0; ; attempt += 1) {
    if (tx.stuck()) {
      // an earlier attempt (this turn's, redelivered after an error) left its transaction unsettled
      const outcome = await settle(tx, next);
      if (outcome !== 'aborted') return outcome;
    }
    const producer = tx.producer();
    if (producer === undefined) return 'fenced'; // revoked meanwhile: the next owner answers it
    let txn: Tx | undefined;
    let asked = false; // EndTxn(commit) was sent: from here the outcome is unknown until answered
    try {
      txn = await producer.transaction();
      await fill(txn);
      await txn.sendOffsets({
        consumerGroupId: tx.groupId,
        topics: [{ topic: tx.topic, partitions: [{ partition: tx.partition, offset: next.toString() }] }],
      });
      asked = true;
      await txn.commit();
      return 'committed';
    } catch (error) {
      if (isFenced(error)) return 'fenced';
      // Not asked to commit: an abort the broker answers ends it. Otherwise (in doubt, or the abort unanswered
      // too) the producer is stuck in KafkaJS' COMMITTING/ABORTING state: settled on a new one.
      const ended = !asked && txn !== undefined && (await txn.abort().then(() => true, () => false));
      if (!ended && txn !== undefined) {
        tx.log('warn', asked ? 'commit in doubt: settling it before anything is sent again' : 'abort unanswered: reopening the transactional producer', {
          partition: tx.partition,
          offset,
          error: String(error),
        });
        const outcome = await settle(tx, next);
        if (outcome !== 'aborted') return outcome;
      }
      if (!isOutage(error) && !(asked && txn !== undefined)) throw error;
      if (tx.givenUp()) return 'given-up';
      await tx.pause(attempt);
    }
  }
}
