// The package's pure half and the Mastra adapter, without Kafka: node --test build/test/unit.test.js
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import * as otel from '@opentelemetry/api';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { Agent } from '@mastra/core/agent';

import {
  buildResponse,
  enrichedProblem,
  extractedMetadata,
  extractedProblem,
  EXTRACTED_MAX_BYTES,
  EXTRACTED_MAX_DEPTH,
  THREAD_TITLE_MAX_CHARS,
  observeKey,
  mastraObserverHandler,
  observerHandler,
  ObserverWorker,
  workProblem,
  type MastraObservationalMemoryLike,
  type ObserveRequest,
  type ReflectRequest,
  failedResponse,
  replyProblem,
  SeenEvents,
  Turn,
  type EnrichedMessage,
  type EnrichedRequest,
} from '../src/index.js';
import { mastraHandler } from '../src/mastra.js';
import { respond, RetryLater, TurnGivenUp, TurnTimeout } from '../src/respond.js';
import { connectionFromEnv, type ConnectionOptions } from '../src/settings.js';
import { loadTracing, tracingWith } from '../src/tracing.js';
import { enrichedRequest, javaPartition, MemoryKafka, memoryClient, murmur2, TestHarness, text } from '../src/testing.js';
import { AgentWorker } from '../src/worker.js';
import { isOutage, runTransaction, type Tx, type TxPartition, type TxProducer } from '../src/transactions.js';
import { prompts, signals, stubModel } from './stub-model.js';
import { omPrompts, promptText, stubObserverModel } from './stub-om-model.js';

function message(id: string, role: EnrichedMessage['role'], text: string, createdAt: string, source: 'memory' | 'input'): EnrichedMessage {
  return { id, role, createdAt, source, threadId: 't1', resourceId: 'r1', type: 'v2', content: { format: 2, parts: [{ type: 'text', text }] } };
}

function enriched(overrides: Partial<EnrichedRequest> = {}): EnrichedRequest {
  return {
    schemaVersion: 1,
    requestId: 'req-2',
    eventId: 'req-2',
    threadId: 't1',
    resourceId: 'r1',
    createdAt: '2026-01-01T00:00:02.000Z',
    history: { recalled: 2, limit: 40 },
    messages: [
      message('req-1:input:0', 'user', 'hello', '2026-01-01T00:00:00.000Z', 'memory'),
      message('req-1:response:0', 'assistant', 'hi', '2026-01-01T00:00:01.000Z', 'memory'),
      message('req-2:input:0', 'user', 'again', '2026-01-01T00:00:02.000Z', 'input'),
    ],
    ...overrides,
  };
}

describe('buildResponse', () => {
  it('echoes the ids, puts the whole context with its source in input, and the reply in response', () => {
    const turn = new Turn(enriched({ metadata: { app: 'x' } }));
    const response = buildResponse(turn, 'an answer', new Date('2026-01-01T00:00:05.000Z'));
    assert.equal(response.requestId, 'req-2');
    assert.equal(response.threadId, 't1');
    assert.equal(response.resourceId, 'r1');
    assert.deepEqual(response.metadata, { app: 'x' });
    assert.deepEqual(response.input.map((m) => m.source), ['memory', 'memory', 'input']);
    const [first] = response.response;
    assert.equal(first?.id, undefined, 'ids are left to the service');
    assert.deepEqual(response.response, [
      { role: 'assistant', content: { format: 2, parts: [{ type: 'text', text: 'an answer' }] } },
    ]);
    assert.equal(response.finishReason, 'stop');
    assert.equal(response.createdAt, '2026-01-01T00:00:05.000Z');
    assert.equal(response.memory, undefined);
  });

  it('never dates the answer before the newest message of the context (worker clock behind)', () => {
    const response = buildResponse(new Turn(enriched()), 'x', new Date('2025-12-31T00:00:00.000Z'));
    assert.equal(response.createdAt, '2026-01-01T00:00:02.001Z');
  });

  it('passes memory.readOnly on, unless the reply says otherwise', () => {
    const turn = new Turn(enriched({ memory: { readOnly: true } }));
    assert.deepEqual(buildResponse(turn, 'x').memory, { readOnly: true });
    assert.deepEqual(buildResponse(turn, { messages: [], readOnly: false }).memory, { readOnly: false });
  });

  it('answers a failed turn with no message and finishReason "error"', () => {
    const response = failedResponse(new Turn(enriched()));
    const [first] = response.response;
    assert.equal(first?.id, undefined, 'ids are left to the service');
    assert.deepEqual(response.response, []);
    assert.equal(response.finishReason, 'error');
    assert.equal(response.input.length, 3);
  });
});

describe('checks', () => {
  const cases: [string, unknown, string | undefined][] = [
    ['a valid request', enriched(), undefined],
    ['not an object', [1], 'not a JSON object'],
    ['another schema version', enriched({ schemaVersion: 2 as 1 }), 'schemaVersion 2 is not 1'],
    ['no eventId', { ...enriched(), eventId: undefined }, 'eventId is missing or not a string'],
    ['a message without source', enriched({ messages: [{ ...message('a', 'user', 'x', '2026-01-01T00:00:00.000Z', 'input'), source: undefined as never }] }), 'messages[0] has no source'],
  ];
  for (const [name, value, problem] of cases) {
    it(`enrichedProblem: ${name}`, () => assert.equal(enrichedProblem(value), problem));
  }
  it('replyProblem: a message without a role cannot be sent', () => {
    assert.equal(replyProblem({ messages: [{ role: 'assistant', content: { format: 2, parts: [] } }] }), undefined);
    assert.equal(replyProblem({ messages: [{ content: 'x' } as never] }), 'response[0] has no role');
  });
});

describe('SeenEvents', () => {
  it('remembers per partition, at most perPartition ids, least recently seen dropped first', () => {
    const seen = new SeenEvents(2);
    seen.add(0, 'a');
    seen.add(0, 'b');
    assert.equal(seen.has(1, 'a'), false, 'another partition');
    assert.equal(seen.has(0, 'a'), true); // now the most recent
    seen.add(0, 'c'); // drops b
    assert.equal(seen.has(0, 'b'), false);
    assert.equal(seen.has(0, 'a'), true);
    assert.equal(seen.size(0), 2);
  });
  it('refuses a size below 1', () => assert.throws(() => new SeenEvents(0), RangeError));
});

describe('mastraHandler', () => {
  const agent = new Agent({ id: 'assistant', name: 'assistant', instructions: 'Answer briefly.', model: stubModel });

  it('gives the Agent the whole context and answers with its new messages, without ids', async () => {
    const reply = await mastraHandler(agent)(new Turn(enriched()));
    assert.equal(prompts.at(-1)?.length, 1 + 3, 'the instructions plus the three messages of the context');
    assert.equal(reply.finishReason, 'stop');
    assert.equal(reply.messages.length, 1);
    const [answer] = reply.messages;
    assert.equal(answer?.role, 'assistant');
    assert.equal(answer?.id, undefined);
    assert.equal(answer?.createdAt, undefined);
    assert.match(JSON.stringify(answer?.content), /I remember 2 earlier messages\. You said: again/);
  });

  it("the Agent's answer fits the AgentResponse schema (through the worker's turn code)", async () => {
    const { outcome } = await respond(mastraHandler(agent), (signal) => new Turn(enriched(), 0, '0', signal));
    assert.equal(outcome.kind, 'answered', outcome.kind === 'failed' ? outcome.failure : '');
  });

  it('lets a model error through (the worker answers a failed turn)', async () => {
    const failing = enriched({ messages: [message('req-2:input:0', 'user', 'FAIL please', '2026-01-01T00:00:02.000Z', 'input')] });
    await assert.rejects(mastraHandler(agent)(new Turn(failing)), /the model failed/);
  });

  it('refuses an Agent with its own memory', () => {
    assert.throws(() => mastraHandler({ name: 'm', hasOwnMemory: () => true, generate: agent.generate.bind(agent) as never }), /without `memory`/);
  });
});

describe('respond: turns that end', () => {
  const never = (turn: Turn): Promise<string> =>
    new Promise((_, reject) => turn.signal.addEventListener('abort', () => reject(turn.signal.reason)));

  it('a handler over its time: its signal is aborted (TurnTimeout) and the turn fails with the reason', async () => {
    const { turn, outcome } = await respond(never, (signal) => new Turn(enriched(), 0, '0', signal), { timeoutMs: 50 });
    assert.equal(turn.signal.aborted, true);
    assert.ok(turn.signal.reason instanceof TurnTimeout);
    assert.equal(outcome.kind, 'failed');
    assert.match(outcome.kind === 'failed' ? outcome.failure : '', /still running after 50 ms/);
    assert.equal(outcome.kind === 'failed' ? outcome.response.finishReason : '', 'error');
  });

  it('a worker giving up (shutdown): the signal is aborted (TurnGivenUp), nothing is answered', async () => {
    const giveUp = new AbortController();
    const running = respond(never, (signal) => new Turn(enriched(), 0, '0', signal), { giveUp: giveUp.signal });
    giveUp.abort();
    const { turn, outcome } = await running;
    assert.ok(turn.signal.reason instanceof TurnGivenUp);
    assert.equal(outcome.kind, 'gave-up');
  });

  it('a reply that cannot be sent is a failed turn with the reason, the handler called once', async () => {
    let calls = 0;
    const bad = async (): Promise<{ messages: never[] }> => {
      calls += 1;
      return { messages: [{ content: 'x' } as never] };
    };
    const { outcome } = await respond(bad, (signal) => new Turn(enriched(), 0, '0', signal));
    assert.equal(calls, 1);
    assert.equal(outcome.kind === 'failed' ? outcome.failure : '', 'the reply cannot be sent: response[0] has no role');
  });

  it('mastraHandler gives the model the turn signal: a timed-out turn stops the model call', async () => {
    const agent = new Agent({ id: 'assistant', name: 'assistant', instructions: 'Answer briefly.', model: stubModel });
    const slow = enriched({ messages: [message('req-2:input:0', 'user', 'SLOW please', '2026-01-01T00:00:02.000Z', 'input')] });
    const { outcome } = await respond(mastraHandler(agent), (signal) => new Turn(slow, 0, '0', signal), { timeoutMs: 100 });
    assert.equal(outcome.kind, 'failed');
    assert.equal(signals.at(-1)?.aborted, true, 'the signal the model was given is aborted');
  });
});

describe('@message-history/worker/testing', () => {
  it('enrichedRequest builds a request the worker accepts: history then input', () => {
    const event = enrichedRequest({ threadId: 't', text: 'now', history: [{ role: 'user', text: 'before' }, { role: 'assistant', text: 'ok' }] });
    assert.equal(enrichedProblem(event), undefined);
    assert.deepEqual(event.messages.map((m) => [m.source, text(m)]), [['memory', 'before'], ['memory', 'ok'], ['input', 'now']]);
    assert.equal(event.history.recalled, 2);
  });

  it('TestHarness: one thread in order, threads at the same time, failures with their reason', async () => {
    const log: string[] = [];
    let release!: () => void;
    const held = new Promise<void>((resolve) => {
      release = resolve;
    });
    const harness = new TestHarness(async (turn) => {
      const said = text(turn.input[0]!);
      log.push(`start ${said}`);
      if (said === 'a1') await held; // a's second turn must wait; b must not
      if (said === 'b1') release();
      if (said === 'FAIL') throw new Error('the model failed');
      log.push(`end ${said}`);
      return `re: ${said}`;
    });
    const results = await harness.send({ threadId: 'a', text: 'a1' }, { threadId: 'a', text: 'a2' }, { threadId: 'b', text: 'b1' }, { threadId: 'b', text: 'FAIL' });
    assert.deepEqual(results.map((r) => text(r.response)), ['re: a1', 're: a2', 're: b1', '']);
    assert.ok(log.indexOf('end a1') < log.indexOf('start a2'), 'in order within a thread');
    assert.ok(log.indexOf('start b1') < log.indexOf('end a1'), 'another thread runs meanwhile');
    assert.equal(results[3]?.failure, 'Error: the model failed');
    assert.equal(results[3]?.response.finishReason, 'error');
    assert.equal(harness.responses.length, 4);
  });

  it('TestHarness: a request answered already is dropped, as the worker drops it', async () => {
    const harness = new TestHarness(async (turn) => `re: ${text(turn.input[0]!)}`);
    const event = enrichedRequest({ requestId: 'same', text: 'once' });
    assert.equal((await harness.send(event)).length, 1);
    assert.deepEqual(await harness.send(event), []);
    assert.deepEqual(harness.duplicates, ['same']);
  });
});

describe('connectionFromEnv: the service\'s variables', () => {
  const files: Record<string, string> = { '/ca.pem': 'PEM' };
  const read = (path: string): string => files[path] ?? assert.fail(`read ${path}`);
  const cases: [string, Record<string, string>, ConnectionOptions | RegExp][] = [
    ['nothing set: local plaintext', {}, { brokers: ['127.0.0.1:9092'] }],
    ['brokers listed', { KAFKA_BOOTSTRAP_SERVERS: 'a:1, b:2' }, { brokers: ['a:1', 'b:2'] }],
    ['SSL with the system CAs', { MESSAGE_HISTORY_KAFKA_SECURITY_PROTOCOL: 'SSL' }, { brokers: ['127.0.0.1:9092'], ssl: true }],
    ['SSL with a CA file', { MESSAGE_HISTORY_KAFKA_SECURITY_PROTOCOL: 'SSL', MESSAGE_HISTORY_KAFKA_SSL_CAFILE: '/ca.pem' }, { brokers: ['127.0.0.1:9092'], ssl: { ca: 'PEM' } }],
    [
      'SASL_SSL with SCRAM',
      { MESSAGE_HISTORY_KAFKA_SECURITY_PROTOCOL: 'SASL_SSL', MESSAGE_HISTORY_KAFKA_SASL_MECHANISM: 'SCRAM-SHA-512', MESSAGE_HISTORY_KAFKA_SASL_USERNAME: 'w', MESSAGE_HISTORY_KAFKA_SASL_PASSWORD: 'p' },
      { brokers: ['127.0.0.1:9092'], ssl: true, sasl: { mechanism: 'scram-sha-512', username: 'w', password: 'p' } },
    ],
    [
      'SASL_PLAINTEXT: PLAIN by default, as aiokafka',
      { MESSAGE_HISTORY_KAFKA_SECURITY_PROTOCOL: 'SASL_PLAINTEXT', MESSAGE_HISTORY_KAFKA_SASL_USERNAME: 'w', MESSAGE_HISTORY_KAFKA_SASL_PASSWORD: 'p' },
      { brokers: ['127.0.0.1:9092'], sasl: { mechanism: 'plain', username: 'w', password: 'p' } },
    ],
    ['SASL without credentials', { MESSAGE_HISTORY_KAFKA_SECURITY_PROTOCOL: 'SASL_SSL' }, /needs MESSAGE_HISTORY_KAFKA_SASL_USERNAME/],
    ['an unknown protocol', { MESSAGE_HISTORY_KAFKA_SECURITY_PROTOCOL: 'TLS' }, /one of PLAINTEXT, SSL/],
    ['an unknown mechanism', { MESSAGE_HISTORY_KAFKA_SECURITY_PROTOCOL: 'SASL_SSL', MESSAGE_HISTORY_KAFKA_SASL_MECHANISM: 'GSSAPI', MESSAGE_HISTORY_KAFKA_SASL_USERNAME: 'w', MESSAGE_HISTORY_KAFKA_SASL_PASSWORD: 'p' }, /one of PLAIN, SCRAM/],
  ];
  for (const [name, env, expected] of cases) {
    it(name, () => {
      if (expected instanceof RegExp) assert.throws(() => connectionFromEnv(env, read), expected);
      else assert.deepEqual(connectionFromEnv(env, read), expected);
    });
  }
});

describe('replies checked against the AgentResponse schema (a failed turn with the reason, as in Python)', () => {
  const cases: [string, unknown, RegExp | undefined][] = [
    ['a text reply', 'hi', undefined],
    ['a misspelled role', { messages: [{ role: 'asistant', content: { format: 2, parts: [{ type: 'text', text: 'x' }] } }] }, /\/response\/0\/role must be equal to one of the allowed values/],
    ['content without parts', { messages: [{ role: 'assistant', content: { format: 2 } }] }, /\/response\/0\/content must have required property 'parts'/],
    ['a text part without its text', { messages: [{ role: 'assistant', content: { format: 2, parts: [{ type: 'text' }] } }] }, /\/response\/0\/content\/parts\/0/],
    ['content as a plain string', { messages: [{ role: 'assistant', content: 'x' }] }, /\/response\/0\/content must be object/],
  ];
  for (const [name, reply, failure] of cases) {
    it(name, async () => {
      const { outcome } = await respond(async () => reply as never, (signal) => new Turn(enriched(), 0, '0', signal));
      if (failure === undefined) assert.equal(outcome.kind, 'answered');
      else {
        assert.equal(outcome.kind, 'failed');
        assert.match(outcome.kind === 'failed' ? outcome.failure : '', failure);
        assert.match(outcome.kind === 'failed' ? outcome.failure : '', /^the reply does not fit the AgentResponse schema/);
      }
    });
  }
});

describe('retry later: distinct from a failed turn', () => {
  it('a RetryLater (a rate limit) backs off and redoes the same turn until it answers', async () => {
    let calls = 0;
    const limited = async (): Promise<string> => {
      calls += 1;
      if (calls < 3) throw new RetryLater('429 from the provider', 1);
      return 'answered at last';
    };
    const retries: number[] = [];
    const { outcome } = await respond(limited, (signal) => new Turn(enriched(), 0, '0', signal), {
      retryInitialMs: 1,
      retryMaxMs: 2,
      onRetry: ({ attempt }) => retries.push(attempt),
    });
    assert.equal(outcome.kind, 'answered');
    assert.equal(calls, 3);
    assert.deepEqual(retries, [1, 2]);
  });

  it('an error with retriable: true counts too; a plain error is a failed turn at once', async () => {
    const [retried] = await new TestHarness(
      (() => {
        let first = true;
        return async () => {
          if (first) {
            first = false;
            throw Object.assign(new Error('overloaded'), { retriable: true });
          }
          return 'ok';
        };
      })(),
    ).send({ text: 'x' });
    assert.equal(retried?.retries, 1);
    assert.equal(text(retried!.response), 'ok');
    const [failed] = await new TestHarness(async () => {
      throw new Error('bad request');
    }).send({ text: 'x' });
    assert.equal(failed?.retries, 0);
    assert.equal(failed?.response.finishReason, 'error');
  });

  it('a worker stopping during the backoff gives the turn up (left for the next owner)', async () => {
    const giveUp = new AbortController();
    const running = respond(async () => { throw new RetryLater('later'); }, (signal) => new Turn(enriched(), 0, '0', signal), {
      retryInitialMs: 60_000,
      giveUp: giveUp.signal,
      onRetry: () => giveUp.abort(),
    });
    assert.equal((await running).outcome.kind, 'gave-up');
  });
});

describe('a span per turn, continuing the request traceparent', () => {
  const exporter = new InMemorySpanExporter();
  otel.trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
  otel.propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  const traceId = '0af7651916cd43dd8448eb211c80319c';
  const parent = 'b7ad6b7169203331';

  it('is a child of the request span; the response carries the turn span in place of the request one', async () => {
    exporter.reset();
    const span = tracingWith(otel)({ traceparent: `00-${traceId}-${parent}-01`, other: Buffer.from('kept') }, { 'messaging.message.id': 'r1' });
    assert.equal(await span.run(async () => 'inside'), 'inside');
    const out = span.headers({ traceparent: `00-${traceId}-${parent}-01`, other: 'kept' });
    span.end('the model failed');
    const [finished] = exporter.getFinishedSpans();
    assert.equal(finished?.name, 'agent turn');
    assert.equal(finished?.spanContext().traceId, traceId);
    assert.equal(finished?.parentSpanContext?.spanId, parent);
    assert.equal(finished?.attributes['messaging.message.id'], 'r1');
    assert.deepEqual(finished?.status, { code: otel.SpanStatusCode.ERROR, message: 'the model failed' });
    assert.equal(out?.traceparent, `00-${traceId}-${finished?.spanContext().spanId}-01`);
    assert.equal(out?.other, 'kept');
  });

  it('loads @opentelemetry/api when it is installed', async () => {
    exporter.reset();
    (await loadTracing())(undefined, {}).end();
    assert.equal(exporter.getFinishedSpans().length, 1);
  });
});

// A broker and KafkaJS-like transactional producers in memory: a failed commit leaves the producer stuck
// (KafkaJS' COMMITTING state: no commit, abort or new transaction), and `reopen` is InitProducerId on the
// same id (completes what the old producer left open).
class FakeTxBroker {
  visible: string[] = [];
  committed: bigint | undefined;
  /** The next commit: 'lands-unanswered' commits and then times out; 'lost' times out without committing. */
  nextCommit: 'ok' | 'lands-unanswered' | 'lost' = 'ok';
  owned = true;
  stopped = false;
  begun = 0;

  producer(): TxProducer {
    let stuck = false;
    return {
      transaction: async () => {
        if (stuck) throw new Error('Transaction state exception: Cannot call "beginTransaction" in state "COMMITTING"');
        this.begun += 1;
        const records: string[] = [];
        let offset: bigint | undefined;
        const timeout = Object.assign(new Error('Request EndTxn timed out'), { name: 'KafkaJSRequestTimeoutError' });
        return {
          send: async (record) => {
            records.push(...record.messages.map((m) => m.value));
          },
          sendOffsets: async ({ topics }) => {
            offset = BigInt(topics[0]!.partitions[0]!.offset);
          },
          commit: async () => {
            const how = this.nextCommit;
            this.nextCommit = 'ok';
            if (how !== 'lost') {
              this.visible.push(...records);
              this.committed = offset;
            }
            if (how !== 'ok') {
              stuck = true;
              throw timeout;
            }
          },
          abort: async () => {
            if (stuck) throw new Error('Transaction state exception: Cannot call "abort" in state "COMMITTING"');
          },
        };
      },
    };
  }

  /** The next reopens fail with this many errors that are not an outage (the worker's eachMessage throws). */
  reopenFailures = 0;

  partition(): TxPartition & { current: TxProducer | undefined } {
    let stuck = false;
    const tx = {
      groupId: 'g',
      topic: 'in',
      partition: 0,
      current: this.producer() as TxProducer | undefined,
      producer: () => tx.current,
      stuck: () => stuck,
      reopen: async () => {
        stuck = true;
        if (this.reopenFailures-- > 0) throw new Error('something unexpected');
        tx.current = this.owned ? this.producer() : undefined;
        stuck = false;
        return tx.current;
      },
      committed: async () => this.committed,
      givenUp: () => this.stopped,
      pause: async () => undefined,
      log: () => undefined,
    };
    return tx;
  }
}

const reply = (value: string) => async (txn: Tx) => {
  await txn.send({ topic: 'out', messages: [{ key: 'k', value }] });
};

/** The rule before: a commit that times out is taken for an abort, and the reply sent again on a fresh producer. */
async function guessingRule(tx: TxPartition, offset: string, fill: (txn: Tx) => Promise<void>): Promise<void> {
  for (;;) {
    const txn = await tx.producer()!.transaction();
    try {
      await fill(txn);
      await txn.sendOffsets({ consumerGroupId: tx.groupId, topics: [{ topic: tx.topic, partitions: [{ partition: 0, offset: String(BigInt(offset) + 1n) }] }] });
      await txn.commit();
      return;
    } catch (error) {
      await txn.abort().catch(() => undefined);
      if (!isOutage(error)) throw error;
      await tx.reopen();
    }
  }
}

describe('exactly-once: a commit in doubt is settled, never guessed', () => {
  it('a commit that landed but timed out: the guessing rule sends the reply twice, runTransaction once', async () => {
    const guessed = new FakeTxBroker();
    guessed.nextCommit = 'lands-unanswered';
    await guessingRule(guessed.partition(), '0', reply('a'));
    assert.deepEqual(guessed.visible, ['a', 'a']); // a read_committed reader sees it twice

    const broker = new FakeTxBroker();
    broker.nextCommit = 'lands-unanswered';
    const tx = broker.partition();
    assert.equal(await runTransaction(tx, '0', reply('a')), 'committed');
    assert.deepEqual(broker.visible, ['a']);
    assert.equal(broker.committed, 1n);
    // the stuck producer was replaced: the next turn goes through
    assert.equal(await runTransaction(tx, '1', reply('b')), 'committed');
    assert.deepEqual(broker.visible, ['a', 'b']);
  });

  it('a commit that timed out and did not land is known aborted once settled: the reply is sent again, once', async () => {
    const broker = new FakeTxBroker();
    broker.nextCommit = 'lost';
    assert.equal(await runTransaction(broker.partition(), '4', reply('a')), 'committed');
    assert.deepEqual(broker.visible, ['a']);
    assert.equal(broker.committed, 5n);
    assert.equal(broker.begun, 2);
  });

  it('not re-initialised once the partition is another worker\'s, nor at the end of the shutdown grace', async () => {
    const revoked = new FakeTxBroker();
    revoked.nextCommit = 'lost';
    revoked.owned = false; // a re-init would fence the new owner: its own InitProducerId settles it
    assert.equal(await runTransaction(revoked.partition(), '0', reply('a')), 'fenced');
    assert.deepEqual(revoked.visible, []);

    const stopping = new FakeTxBroker();
    stopping.nextCommit = 'lost';
    stopping.stopped = true;
    assert.equal(await runTransaction(stopping.partition(), '0', reply('a')), 'given-up');
    assert.equal(stopping.begun, 1);
  });

  it('a settle that threw leaves the partition stuck: the redelivered turn settles it first, sent once', async () => {
    const broker = new FakeTxBroker();
    broker.nextCommit = 'lands-unanswered';
    broker.reopenFailures = 1;
    const tx = broker.partition();
    await assert.rejects(runTransaction(tx, '0', reply('a')), /something unexpected/);
    assert.equal(await runTransaction(tx, '0', reply('a')), 'committed'); // the same turn, redelivered
    assert.deepEqual(broker.visible, ['a']);
    assert.equal(broker.begun, 1);
  });

  it('a coordinator not found (a broker restarting or frozen) is an outage, waited out; fencing is not', () => {
    const wrapped = (name: string) =>
      Object.assign(new Error('Failed to find group coordinator'), {
        name: 'KafkaJSNonRetriableError',
        retriable: false,
        cause: Object.assign(new Error('Failed to find group coordinator'), { name, retriable: false }),
      });
    assert.equal(isOutage(wrapped('KafkaJSGroupCoordinatorNotFound')), true);
    assert.equal(isOutage(wrapped('KafkaJSConnectionClosedError')), true);
    assert.equal(isOutage(new Error('Broker not connected')), true); // KafkaJS' Broker, reconnecting
    assert.equal(isOutage(wrapped('KafkaJSProtocolError')), false);
  });

  it('an outage before the commit is asked: aborted, retried on the same producer', async () => {
    const broker = new FakeTxBroker();
    const tx = broker.partition();
    const first = tx.current;
    let failures = 1;
    const flaky = async (txn: Tx) => {
      if (failures-- > 0) throw Object.assign(new Error('Connection error'), { name: 'KafkaJSConnectionError' });
      await reply('a')(txn);
    };
    assert.equal(await runTransaction(tx, '0', flaky), 'committed');
    assert.deepEqual(broker.visible, ['a']);
    assert.equal(tx.current, first);
  });
});

describe('the in-memory Kafka: keys land where the service puts them (Java murmur2)', () => {
  // [key, murmur2 as an unsigned 32-bit integer, partition of 6] from aiokafka (the service's producer):
  // aiokafka.partitioner.murmur2(key.encode()) and DefaultPartitioner()(key, range(6), range(6)).
  const java: [string, number, number][] = [
    ['', 275646681, 3],
    ['a', 2731586172, 4],
    ['ab', 316155434, 2],
    ['abc', 479470107, 3],
    ['thread-1', 4210454590, 2],
    ['thread-42', 1087239475, 1],
    ['héllo wörld', 439213890, 0],
    ['00000000-0000-0000-0000-000000000000', 713427837, 3],
    ['x'.repeat(37), 4016325283, 5],
  ];
  for (const [key, hash, partition] of java) {
    it(`${JSON.stringify(key.length > 12 ? key.slice(0, 12) + '…' : key)}: hash ${hash}, partition ${partition} of 6`, () => {
      assert.equal(murmur2(Buffer.from(key, 'utf8')) >>> 0, hash);
      assert.equal(javaPartition(key, 6), partition);
    });
  }
  it('an appended record sits on its key\'s partition', () => {
    const broker = new MemoryKafka(6);
    const [placed] = broker.append('t', [{ key: 'thread-42', value: 'v' }]);
    assert.deepEqual(placed, { partition: 1, offset: 0n });
  });
});

/** A handler whose turns finish when the test says so: `open(text)` resolves that turn. */
function gated(): { handler: (turn: Turn) => Promise<string>; started: string[]; running: () => number; most: () => number; open: (said: string) => void; waitFor: (n: number) => Promise<void> } {
  const gates = new Map<string, () => void>();
  const started: string[] = [];
  const waiters: [number, () => void][] = [];
  let running = 0;
  let most = 0;
  const wake = (): void => {
    for (const [n, resolve] of [...waiters]) if (started.length >= n) resolve();
  };
  return {
    started,
    running: () => running,
    most: () => most,
    open: (said) => {
      const gate = gates.get(said);
      if (gate === undefined) assert.fail(`${said} has not started`);
      gate();
    },
    waitFor: (n) => new Promise((resolve) => {
      waiters.push([n, resolve]);
      wake();
    }),
    handler: async (turn) => {
      const said = text(turn.input[0]!);
      running += 1;
      most = Math.max(most, running);
      const gate = new Promise<void>((resolve) => gates.set(said, resolve));
      started.push(said);
      wake();
      await gate;
      running -= 1;
      return `re: ${said}`;
    },
  };
}

describe('the worker on the in-memory Kafka: turns per thread at once, commits past the done prefix', () => {
  const settle = () => new Promise((resolve) => setImmediate(resolve));

  it('threads of one partition run at the same time, one thread in order; the offset waits for the oldest turn', async () => {
    const g = gated();
    const harness = new TestHarness(g.handler);
    const sent = harness.send({ threadId: 'a', text: 'a1' }, { threadId: 'b', text: 'b1' }, { threadId: 'a', text: 'a2' });
    await g.waitFor(2);
    assert.deepEqual([...g.started].sort(), ['a1', 'b1'], 'a2 waits for a1; b1 runs beside a1');
    g.open('b1');
    for (let i = 0; i < 20; i += 1) await settle();
    assert.equal(harness.responses.length, 1, 'b1 is answered at once');
    assert.equal(harness.broker.committed('test-harness', 'agent.requests.enriched').get(0), undefined, 'not past a1, still running');
    g.open('a1');
    await g.waitFor(3);
    assert.equal(g.started[2], 'a2');
    g.open('a2');
    const results = await sent;
    assert.deepEqual(results.map((r) => text(r.response)), ['re: a1', 're: b1', 're: a2']);
    await harness.close();
    assert.equal(harness.broker.committed('test-harness', 'agent.requests.enriched').get(0), 3n);
  });

  it('at most maxConcurrentTurnsPerPartition turns in flight', async () => {
    const g = gated();
    const harness = new TestHarness(g.handler, { maxConcurrentTurnsPerPartition: 2 });
    const sent = harness.send(...['t1', 't2', 't3', 't4'].map((t) => ({ threadId: t, text: t })));
    await g.waitFor(2);
    for (let i = 0; i < 20; i += 1) await settle();
    assert.equal(g.started.length, 2, 'the third waits for room');
    for (const t of ['t1', 't2']) g.open(t);
    await g.waitFor(4);
    for (const t of ['t3', 't4']) g.open(t);
    assert.equal((await sent).length, 4);
    assert.equal(g.most(), 2);
    await harness.close();
  });

  it('a hung turn holds its own thread and the commit only: the turns queued behind it take no room from another thread', async () => {
    const g = gated();
    const harness = new TestHarness(g.handler, { maxConcurrentTurnsPerPartition: 2 });
    const sent = harness.send(
      ...['a1', 'a2', 'a3'].map((t) => ({ threadId: 'a', text: t })), // a1 and 2 (the cap) behind it
      { threadId: 'b', text: 'b1' },
      { threadId: 'c', text: 'c1' },
    );
    await g.waitFor(1);
    for (let i = 0; i < 50; i += 1) await settle();
    assert.deepEqual([...g.started].sort(), ['a1', 'b1'], 'a2, a3 wait behind a1 without a turn\'s room; b1 runs');
    g.open('b1');
    await g.waitFor(3);
    assert.equal(g.started[2], 'c1');
    g.open('c1');
    for (let i = 0; i < 20; i += 1) await settle();
    assert.equal(harness.responses.length, 2, 'b1 and c1 answered while a1 hangs');
    assert.equal(harness.broker.committed('test-harness', 'agent.requests.enriched').get(0), undefined, 'the commit waits for a1');
    for (const t of ['a1', 'a2', 'a3']) {
      await g.waitFor(g.started.length);
      g.open(t);
      for (let i = 0; i < 20; i += 1) await settle();
    }
    assert.equal((await sent).length, 5);
    assert.equal(g.most(), 2);
    await harness.close();
    assert.equal(harness.broker.committed('test-harness', 'agent.requests.enriched').get(0), 5n);
  });

  it('what queues behind a hung turn is bounded: past maxPendingRecordsPerPartition the next record waits', async () => {
    const g = gated();
    const harness = new TestHarness(g.handler, { maxPendingRecordsPerPartition: 3 });
    const sent = harness.send(
      ...['a1', 'a2', 'a3'].map((t) => ({ threadId: 'a', text: t })), // the bound: a1 running, a2 and a3 queued
      { threadId: 'b', text: 'b1' },
    );
    await g.waitFor(1);
    for (let i = 0; i < 50; i += 1) await settle();
    assert.deepEqual(g.started, ['a1'], 'b1 is not read while three records of the partition are pending');
    g.open('a1');
    await g.waitFor(3);
    assert.deepEqual([...g.started].sort(), ['a1', 'a2', 'b1'], 'a1 done: b1 read, and runs beside a2');
    for (const t of ['b1', 'a2']) g.open(t);
    await g.waitFor(4);
    g.open('a3');
    assert.equal((await sent).length, 4);
    await harness.close();
    assert.equal(harness.broker.committed('test-harness', 'agent.requests.enriched').get(0), 4n);
  });

  it('a rebalance does not wait for the turns in flight (no client lets it): a revoked partition\'s late turn is sent, commits nothing, and is dropped as answered when the partition comes back', async () => {
    const g = gated();
    const harness = new TestHarness(g.handler);
    const committed = (): bigint | undefined => harness.broker.committed('test-harness', 'agent.requests.enriched').get(0);
    const sent = harness.send({ threadId: 'a', text: 'a1' });
    await g.waitFor(1);
    await harness.broker.assign('test-harness', []); // the partition moves away in the middle of a1
    g.open('a1');
    await sent;
    assert.equal(harness.responses.length, 1, 'the late answer is still sent (at-least-once)');
    for (let i = 0; i < 20; i += 1) await settle();
    assert.equal(committed(), undefined, 'nothing of a revoked partition is committed: its new owner reads from there');
    await harness.broker.assign('test-harness', [0]); // given back: read again from the committed offset
    for (let i = 0; i < 100 && harness.duplicates.length === 0; i += 1) await settle();
    assert.equal(harness.duplicates.length, 1, 'a1 again: dropped as answered (same process)');
    assert.deepEqual(g.started, ['a1'], 'the handler ran once');
    for (let i = 0; i < 20 && committed() === undefined; i += 1) await settle();
    assert.equal(committed(), 1n);
    await harness.close();
  });

  it('exactly-once: answers sent in offset order, each with its offset in one transaction', async () => {
    const g = gated();
    const harness = new TestHarness(g.handler, { processingGuarantee: 'exactly-once' });
    const sent = harness.send({ threadId: 'a', text: 'a1' }, { threadId: 'b', text: 'b1' });
    await g.waitFor(2);
    g.open('b1');
    for (let i = 0; i < 20; i += 1) await settle();
    assert.equal(harness.responses.length, 0, 'b1 waits for a1: its transaction would commit past a1');
    g.open('a1');
    await sent;
    assert.deepEqual(harness.responses.map((r) => text(r)), ['re: a1', 're: b1']);
    await harness.close();
    assert.equal(harness.broker.committed('test-harness', 'agent.requests.enriched').get(0), 2n);
  });

  it('a turn retried later holds its own thread only: another thread of the partition is answered meanwhile', async () => {
    let limited = true;
    let attempts = 0;
    const harness = new TestHarness(async (turn) => {
      const said = text(turn.input[0]!);
      // (bounded: were b1 behind a1, a1 would answer first after 50 attempts, and the order check fails)
      if (said === 'a1' && limited && (attempts += 1) <= 50) throw new RetryLater('429', 1);
      if (said === 'b1') limited = false; // answered while a1 backs off
      return `re: ${said}`;
    });
    const results = await harness.send({ threadId: 'a', text: 'a1' }, { threadId: 'b', text: 'b1' });
    assert.deepEqual(harness.responses.map((r) => text(r)), ['re: b1', 're: a1']);
    assert.ok((results[0]?.retries ?? 0) >= 1);
    await harness.close();
    assert.equal(harness.broker.committed('test-harness', 'agent.requests.enriched').get(0), 2n);
  });

  it('an oversized reply is a failed turn once, never a loop (the handler is called once)', async () => {
    let calls = 0;
    const harness = new TestHarness(async () => {
      calls += 1;
      return 'x'.repeat(5_000);
    }, { maxRecordBytes: 4_000 });
    const [result] = await harness.send({ text: 'big' });
    assert.equal(result?.response.finishReason, 'error');
    assert.equal(result?.failure, 'the response is too large for Kafka');
    assert.equal(calls, 1);
    await harness.close();
    assert.equal(harness.broker.committed('test-harness', 'agent.requests.enriched').get(0), 1n);
  });

  it('a restarted worker goes on from the committed offset and drops what it answered (in one process)', async () => {
    const broker = new MemoryKafka(2);
    const calls: string[] = [];
    const handler = async (turn: Turn): Promise<string> => {
      calls.push(turn.requestId);
      return 'ok';
    };
    const options = { brokers: ['memory'], groupId: 'g', client: memoryClient(broker), handleSignals: false, tracing: false, logger: () => undefined };
    const first = new AgentWorker(handler, options);
    const answered = new Promise<void>((resolve) => {
      let n = 0;
      first.on('answered', () => (n += 1) === 2 && resolve());
    });
    const running = first.run();
    broker.append('agent.requests.enriched', [enrichedRequest({ requestId: 'r1', threadId: 'a' }), enrichedRequest({ requestId: 'r2', threadId: 'b' })].map((e) => ({ key: e.threadId, value: JSON.stringify(e) })));
    await answered;
    await first.stop();
    await running;
    const second = new AgentWorker(handler, options);
    const third = new Promise<void>((resolve) => second.on('answered', () => resolve()));
    const again = second.run();
    broker.append('agent.requests.enriched', [enrichedRequest({ requestId: 'r3', threadId: 'a' })].map((e) => ({ key: e.threadId, value: JSON.stringify(e) })));
    await third;
    await second.stop();
    await again;
    assert.deepEqual(calls, ['r1', 'r2', 'r3']);
    assert.equal(broker.records('agent.responses').length, 3);
  });
});

describe('observerHandler: Observational Memory work answered, the claim echoed', () => {
  const claim = {
    schemaVersion: 1 as const,
    requestId: 'req-9',
    createdAt: '2026-01-01T00:10:00.000Z',
    scope: 'thread' as const,
    threadId: 't1',
    resourceId: 'r1',
    recordId: 'row-1',
    generation: 2,
    cycle: 5,
  };
  const observeWork: ObserveRequest = {
    ...claim,
    type: 'ObserveRequest',
    messages: [
      { id: 'm1', role: 'user', createdAt: '2026-01-01T00:00:00.000Z', content: { format: 2, parts: [{ type: 'text', text: 'hi' }] } },
      { id: 'm2', role: 'assistant', createdAt: '2026-01-01T00:01:00.000Z', content: { format: 2, parts: [{ type: 'text', text: 'hello' }] } },
    ],
    activeObservations: '',
    observationTokenCount: 0,
    pendingTokens: 31000,
    messageTokens: 30000,
  };

  it('answers an observation with the ids, the newest date and the text', async () => {
    const handler = observerHandler(async (work) => `- ${work.messages.length} messages`);
    const result = await handler(observeWork);
    assert.equal(result.type, 'ObserveResult');
    assert.deepEqual(
      { recordId: result.recordId, generation: result.generation, cycle: result.cycle, requestId: result.requestId },
      { recordId: 'row-1', generation: 2, cycle: 5, requestId: 'req-9' },
    );
    if (result.type !== 'ObserveResult') throw new Error('not an ObserveResult');
    assert.deepEqual(result.observedMessageIds, ['m1', 'm2']);
    assert.equal(result.lastObservedAt, '2026-01-01T00:01:00.000Z');
    assert.equal(result.observations, '- 2 messages');
    assert.equal(result.error, undefined);
    assert.equal(observeKey(observeWork), 't1');
    assert.equal(observeKey({ ...observeWork, scope: 'resource', threadId: null }), 'r1');
  });

  it('answers resource-scoped work thread by thread, each with its own cursor', async () => {
    const work: ObserveRequest = {
      ...observeWork,
      scope: 'resource',
      threadId: null,
      messages: [
        { ...observeWork.messages[0]!, threadId: 'ta' },
        { ...observeWork.messages[1]!, threadId: 'tb' },
        { ...observeWork.messages[0]!, id: 'm3', createdAt: '2026-01-01T00:02:00.000Z', threadId: 'ta' },
      ],
    };
    const seen: string[][] = [];
    const result = await observerHandler(async (w) => {
      seen.push(w.messages.map((m) => m.id ?? ''));
      const thread = w.messages[0]?.threadId;
      return {
        observations: `- ${thread}`,
        currentTask: 'task',
        ...(thread === 'ta' ? { threadTitle: 'A', extracted: { mood: 'calm' } } : {}),
      };
    })(work);
    if (result.type !== 'ObserveResult') throw new Error('not an ObserveResult');
    assert.deepEqual(seen, [['m1', 'm3'], ['m2']]);
    assert.deepEqual(result.threads, [
      {
        threadId: 'ta',
        lastObservedAt: '2026-01-01T00:02:00.000Z',
        observations: '- ta',
        currentTask: 'task',
        threadTitle: 'A',
        extracted: { mood: 'calm' },
      },
      { threadId: 'tb', lastObservedAt: '2026-01-01T00:01:00.000Z', observations: '- tb', currentTask: 'task' },
    ]);
    assert.deepEqual(result.observedMessageIds, ['m1', 'm2', 'm3']);
    assert.equal(result.lastObservedAt, '2026-01-01T00:02:00.000Z');
  });

  it("answers an extracted the service would refuse with error, as the Python SDK", async () => {
    const deep = (n: number): Record<string, unknown> => (n <= 1 ? { leaf: 1 } : { k: deep(n - 1) });
    const refused: [unknown, RegExp][] = [
      [{ 'a.b': 1 }, /key/],
      [{ $set: 1 }, /key/],
      [{ ok: { __proto__x: 1, constructor: 2 } }, /Mastra refuses/],
      [{ n: 2 ** 53 }, /MAX_SAFE_INTEGER/],
      [{ n: [Infinity] }, /not finite/],
      [deep(EXTRACTED_MAX_DEPTH + 1), /deeper/],
      [{ big: 'x'.repeat(EXTRACTED_MAX_BYTES) }, /bytes as JSON/],
    ];
    for (const [extracted, why] of refused) {
      assert.match(extractedProblem(extracted) ?? '', why, JSON.stringify(extracted));
      const thread = await observerHandler(async () => ({ observations: 'o', extracted: extracted as Record<string, unknown> }))(observeWork);
      assert.match(thread.error ?? '', /extracted/);
      const resource = await observerHandler(async () => ({ observations: 'o', extracted: extracted as Record<string, unknown> }))({
        ...observeWork,
        scope: 'resource',
        threadId: null,
      });
      assert.match(resource.error ?? '', /extracted/);
      assert.equal(resource.type === 'ObserveResult' ? resource.threads : 'reflect', undefined);
    }
    const biggest = { big: 'x'.repeat(EXTRACTED_MAX_BYTES - '{"big":""}'.length) };
    for (const extracted of [biggest, deep(EXTRACTED_MAX_DEPTH), { n: -(2 ** 53 - 1), f: 0.5, b: [true, null] }]) {
      assert.equal(extractedProblem(extracted), undefined);
      const ok = await observerHandler(async () => ({ observations: 'o', extracted }))(observeWork);
      assert.equal(ok.error, undefined);
      assert.deepEqual(ok.type === 'ObserveResult' ? ok.extracted : undefined, extracted);
    }
  });

  it('answers a threadTitle the service would refuse with error, as the Python SDK', async () => {
    // counted in code points, as the service's schema counts: an emoji is one
    const longest = '🙂'.repeat(THREAD_TITLE_MAX_CHARS);
    for (const scope of ['thread', 'resource'] as const) {
      const work = { ...observeWork, scope, threadId: scope === 'thread' ? observeWork.threadId : null };
      const refused = await observerHandler(async () => ({ observations: 'o', threadTitle: `${longest}!` }))(work);
      assert.match(refused.error ?? '', /threadTitle is 1001 characters/);
      const ok = await observerHandler(async () => ({ observations: 'o', threadTitle: longest }))(work);
      assert.equal(ok.error, undefined);
    }
  });

  it('answers a failed model with error (the service releases the claim)', async () => {
    const result = await observerHandler(async () => {
      throw new Error('model down');
    })(observeWork);
    assert.equal(result.error, 'Error: model down');
  });

  it('reflects, or says it does not', async () => {
    const work: ReflectRequest = { ...claim, type: 'ReflectRequest', activeObservations: '- a\n- b', observationTokenCount: 41000, observationTokens: 40000 };
    const reflected = await observerHandler(async () => '', async (w) => w.activeObservations.split('\n')[0] ?? '')(work);
    assert.equal(reflected.type, 'ReflectResult');
    if (reflected.type !== 'ReflectResult') throw new Error('not a ReflectResult');
    assert.equal(reflected.reflection, '- a');
    const refused = await observerHandler(async () => '')(work);
    assert.equal(refused.error, 'this observer does not reflect');
  });

  it('tells work from other records', () => {
    assert.equal(workProblem(observeWork), undefined);
    assert.match(workProblem({ ...observeWork, type: 'ObserveResult' }) ?? '', /not work/);
    assert.match(workProblem({ ...observeWork, cycle: 1.5 }) ?? '', /cycle/);
    assert.match(workProblem([]) ?? '', /not a JSON object/);
  });
});

describe('mastraObserverHandler: the Observer and Reflector agents of Mastra answer the work', () => {
  const claim = {
    schemaVersion: 1 as const,
    requestId: 'req-7',
    createdAt: '2026-01-01T00:10:00.000Z',
    scope: 'thread' as const,
    threadId: 't1',
    resourceId: 'r1',
    recordId: 'row-1',
    generation: 0,
    cycle: 3,
  };
  const said = (id: string, role: 'user' | 'assistant', minute: number, text: string) => ({
    id,
    role,
    createdAt: `2026-01-01T00:0${minute}:00.000Z`,
    content: { format: 2 as const, parts: [{ type: 'text', text }] },
  });
  const observeWork = (activeObservations: string, text = 'trains from Lyon to Turin?'): ObserveRequest => ({
    ...claim,
    type: 'ObserveRequest',
    messages: [said('m1', 'user', 0, text), said('m2', 'assistant', 1, 'Spring has the cheapest days.')],
    activeObservations,
    observationTokenCount: 0,
    pendingTokens: 31000,
    messageTokens: 30000,
  });
  const system = (prompt: { role: string }[]) => prompt.filter((m) => m.role === 'system').map((m) => promptText(m as never)).join('\n');
  const shown = (prompt: { role: string }[]) => prompt.filter((m) => m.role !== 'system').map((m) => promptText(m as never)).join('\n');

  it("observes with Mastra's Observer prompt: its observations, current task and suggested response", async () => {
    omPrompts.length = 0;
    const result = await mastraObserverHandler({ model: stubObserverModel })(observeWork('* 🟡 (09:00) User greeted'));
    if (result.type !== 'ObserveResult') throw new Error('not an ObserveResult');
    assert.equal(result.error, undefined);
    assert.equal(result.observations, '* 🔴 (10:00) User asked about trains from Lyon to Turin');
    assert.equal(result.currentTask, 'find the cheapest spring day');
    assert.equal(result.suggestedResponse, 'Ask which week suits them');
    assert.equal(result.threadTitle, 'Cheap spring trains'); // Mastra's parser reads the tag when present
    assert.deepEqual([result.cycle, result.observedMessageIds, result.lastObservedAt], [3, ['m1', 'm2'], '2026-01-01T00:01:00.000Z']);
    const [prompt] = omPrompts;
    assert.ok(prompt);
    const { OBSERVER_SYSTEM_PROMPT } = await import('@mastra/memory/processors');
    assert.ok(system(prompt).includes(OBSERVER_SYSTEM_PROMPT.slice(0, 200)), system(prompt).slice(0, 300));
    assert.match(shown(prompt), /trains from Lyon to Turin\?/); // the work's messages
    assert.match(shown(prompt), /Spring has the cheapest days/);
    assert.match(shown(prompt), /User greeted/); // the log so far
  });

  it("reflects with Mastra's Reflector prompt on the whole log", async () => {
    omPrompts.length = 0;
    const work: ReflectRequest = {
      ...claim,
      type: 'ReflectRequest',
      activeObservations: '* 🔴 (10:00) User asked about trains\n* 🔴 (10:05) User wants the cheapest spring day',
      observationTokenCount: 41000,
      observationTokens: 40000,
    };
    const result = await mastraObserverHandler({ model: stubObserverModel })(work);
    if (result.type !== 'ReflectResult') throw new Error('not a ReflectResult');
    assert.equal(result.error, undefined);
    assert.equal(result.reflection, '* 🔴 (10:00) User plans a spring train trip, cheap days wanted');
    const [prompt] = omPrompts;
    assert.ok(prompt);
    assert.match(system(prompt), /observation reflections/);
    assert.match(shown(prompt), /User wants the cheapest spring day/);
  });

  it("reflects a resource's log with its <thread> sections as text, answered for the resource's row", async () => {
    // Mastra's resource scope reflects as thread scope does: the Reflector (whose system prompt has the
    // "THREAD ATTRIBUTION (Resource Scope)" rules) is given the whole log, sections and all, and its text is
    // the next generation; so is the service's
    omPrompts.length = 0;
    const log = '<thread id="t1">\nDate: Mar 1, 2025\n* 🔴 (10:00) User asked about trains\n</thread>\n\n<thread id="t2">\nDate: Mar 1, 2025\n* 🟡 (11:00) User booked a hotel\n</thread>';
    const work: ReflectRequest = {
      ...claim,
      scope: 'resource',
      threadId: null,
      type: 'ReflectRequest',
      activeObservations: log,
      observationTokenCount: 41000,
      observationTokens: 40000,
    };
    const result = await mastraObserverHandler({ model: stubObserverModel })(work);
    if (result.type !== 'ReflectResult') throw new Error('not a ReflectResult');
    assert.equal(result.error, undefined);
    assert.deepEqual([result.scope, result.threadId, result.resourceId, result.cycle], ['resource', null, 'r1', 3]);
    assert.equal(result.reflection, '* 🔴 (10:00) User plans a spring train trip, cheap days wanted');
    const [prompt] = omPrompts;
    assert.ok(prompt);
    assert.match(system(prompt), /THREAD ATTRIBUTION \(Resource Scope\)/);
    assert.match(shown(prompt), /<thread id="t1">[\s\S]*User asked about trains[\s\S]*<thread id="t2">[\s\S]*User booked a hotel/);
    const plain = await observerHandler(async () => '', async (w) => `kept: ${w.activeObservations.length}`)(work);
    if (plain.type !== 'ReflectResult') throw new Error('not a ReflectResult');
    assert.deepEqual([plain.scope, plain.threadId, plain.reflection], ['resource', null, `kept: ${log.length}`]);
  });

  it("carries Mastra's custom extractors' values as Mastra's persist stores them (observation.extract)", async () => {
    const { ObservationalMemory } = await import('@mastra/memory/processors');
    const { Extractor } = await import('@mastra/memory');
    const { InMemoryStore } = await import('@mastra/core/storage');
    const storage = await new InMemoryStore().getStore('memory');
    const memory = new ObservationalMemory({
      storage,
      scope: 'thread',
      model: stubObserverModel,
      observation: { extract: [new Extractor({ name: 'Mood', instructions: "The user's mood, one word" })] },
    } as never) as unknown as MastraObservationalMemoryLike;
    const result = await mastraObserverHandler({ memory })(observeWork(''));
    if (result.type !== 'ObserveResult') throw new Error('not an ObserveResult');
    assert.equal(result.error, undefined);
    assert.deepEqual(result.extracted, { mood: 'calm' }); // metadata.mastra.om.extracted.mood, as Mastra's
    assert.equal(result.currentTask, 'find the cheapest spring day'); // a built-in extractor: not in extracted
    const plain = await mastraObserverHandler({ model: stubObserverModel })(observeWork(''));
    assert.equal(plain.type === 'ObserveResult' ? plain.extracted : 'reflect', undefined); // none configured
  });

  it("places extracted values as Mastra's buildThreadMetadataFromExtractedValues does", () => {
    const extractors = [
      { slug: 'mood', metadataKeyPath: 'extracted.mood' },
      { slug: 'deep', metadataKeyPath: 'extracted.a.b' },
      { slug: 'current-task', metadataKeyPath: 'currentTask' },
      { slug: 'hook', metadataKeyPath: false as const },
      { slug: 'bad', metadataKeyPath: 'extracted.__proto__.x' },
    ];
    const values = { mood: 'calm', deep: 3, 'current-task': 'book', hook: 'x', bad: 1, empty: '', unknown: 2 };
    assert.deepEqual(extractedMetadata(extractors, values), { extracted: { mood: 'calm', a: { b: 3 } }, currentTask: 'book' });
    assert.deepEqual(extractedMetadata(extractors, { mood: null, deep: '' }), {});
    assert.deepEqual(extractedMetadata(extractors, undefined), {});
  });

  it('answers a failed model with error, and needs a model', async () => {
    const result = await mastraObserverHandler({ model: stubObserverModel })(observeWork('', 'FAIL please'));
    assert.match(result.error ?? '', /failed/);
    const none = await mastraObserverHandler({})(observeWork(''));
    assert.match(none.error ?? '', /needs `model`/);
  });
});

describe('ObserverWorker on the in-memory Kafka: work answered, offsets committed', () => {
  it('answers each work record on the results topic, keyed as the work, and commits past it', { timeout: 20_000 }, async () => {
    const broker = new MemoryKafka();
    const work = {
      schemaVersion: 1,
      type: 'ObserveRequest',
      requestId: 'req-1',
      createdAt: '2026-01-01T00:10:00.000Z',
      scope: 'thread',
      threadId: 't1',
      resourceId: 'r1',
      recordId: 'row-1',
      generation: 0,
      cycle: 1,
      messages: [{ id: 'm1', role: 'user', createdAt: '2026-01-01T00:00:00.000Z', content: { format: 2, parts: [] } }],
      activeObservations: '',
      observationTokenCount: 0,
      pendingTokens: 31000,
      messageTokens: 30000,
    };
    broker.append('agent.memory.observe', [
      { key: 't1', value: JSON.stringify(work) },
      { key: 't1', value: '{not json' },
    ]);
    const worker = new ObserverWorker(observerHandler(async (w) => `- ${w.messages.length} message`), {
      brokers: ['memory'],
      client: memoryClient(broker),
    });
    await worker.start();
    const controller = new AbortController();
    while (broker.committed('message-history-observer', 'agent.memory.observe').get(0) !== 2n) {
      await Promise.race([broker.next(controller.signal), new Promise((resolve) => setTimeout(resolve, 10))]);
    }
    controller.abort();
    await worker.stop();
    const answers = broker.records('agent.memory.observed');
    assert.equal(answers.length, 1);
    assert.equal(answers[0]!.key, 't1');
    const answer = JSON.parse(answers[0]!.value!.toString('utf8')) as Record<string, unknown>;
    assert.deepEqual([answer.type, answer.cycle, answer.observations], ['ObserveResult', 1, '- 1 message']);
    assert.deepEqual([worker.answered, worker.skipped], [1, 1]);
  });
});
