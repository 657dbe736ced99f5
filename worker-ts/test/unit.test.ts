// The package's pure half and the Mastra adapter, without Kafka: node --test build/test/unit.test.js
import assert from 'node:assert/strict';
import { describe, it } from 'node:test';

import { Agent } from '@mastra/core/agent';

import {
  buildResponse,
  enrichedProblem,
  failedResponse,
  replyProblem,
  SeenEvents,
  Turn,
  type EnrichedMessage,
  type EnrichedRequest,
} from '../src/index.js';
import { mastraHandler } from '../src/mastra.js';
import { prompts, stubModel } from './stub-model.js';

function message(id: string, role: string, text: string, createdAt: string, source: 'memory' | 'input'): EnrichedMessage {
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
    assert.equal(replyProblem({ messages: [{ role: 'assistant', content: 'x' }] }), undefined);
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

  it('lets a model error through (the worker answers a failed turn)', async () => {
    const failing = enriched({ messages: [message('req-2:input:0', 'user', 'FAIL please', '2026-01-01T00:00:02.000Z', 'input')] });
    await assert.rejects(mastraHandler(agent)(new Turn(failing)), /the model failed/);
  });

  it('refuses an Agent with its own memory', () => {
    assert.throws(() => mastraHandler({ name: 'm', hasOwnMemory: () => true, generate: agent.generate.bind(agent) as never }), /without `memory`/);
  });
});
