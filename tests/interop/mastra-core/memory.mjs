// Mastra 1.71's conversation memory, driven from tests/interop/test_mastra_memory_interop.py.
//
//   node memory.mjs tokens <pkgdir>   reads {texts, systems, messages} on stdin and prints Mastra's own counts:
//                                     tokenx's estimateTokenCount per text, countCoreSystemMessageTokens per
//                                     system text, TokenLimiterProcessor.countInputMessageTokens per message
//   node memory.mjs recall <pkgdir>   reads {threadId, resourceId, turns, systems, lastMessages, maxTokens,
//                                     atMaxRemoveTokens, readOnly} on stdin; per turn, in one InMemoryStore,
//                                     runs Memory's input pipeline on the turn's user message (MessageHistory
//                                     with the default counter, then the memory-only TokenLimiterProcessor
//                                     with its onMemoryTrim boundary), prints the loaded ids, the context
//                                     ids, the trimmed ids and the stored boundary, then stores the turn
//
//   node memory.mjs filter <pkgdir>   reads {cases: [{threadId, resourceId, stored, input}]} on stdin; per case,
//                                     Mastra's MemoryInputFilter over an InMemoryStore holding `stored`;
//                                     prints each case's input after the filter (ids and parts)
//   node memory.mjs persist <pkgdir>  reads {cases: [{stored, input, response}]}; per case, one turn of Memory's
//                                     pipeline without a budget, then processOutputResult; prints the stored
//                                     rows after it (ids and parts)
//
// <pkgdir> holds the @mastra/core under test (v1/: 1.71.0).
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const [command, pkgdir = 'v1'] = process.argv.slice(2);
const requireFrom = createRequire(join(resolve(pkgdir), 'package.json'));
const load = async (name) => import(pathToFileURL(requireFrom.resolve(name)).href);
const version = JSON.parse(readFileSync(requireFrom.resolve('@mastra/core/package.json'), 'utf8')).version;
const { TokenLimiterProcessor, MessageHistory } = await load('@mastra/core/processors');

function tokens(input) {
  const counter = new TokenLimiterProcessor(1_000_000);
  return Promise.all([
    input.texts.map((text) => counter.countTokens(text)),
    Promise.all(input.systems.map((text) => counter.countCoreSystemMessageTokens({ role: 'system', content: text }))),
    Promise.all(input.messages.map((message) => counter.countInputMessageTokens(message))),
  ]).then(([texts, systems, messages]) => ({ version, texts, systems, messages }));
}

const withDate = (message) => ({ ...message, createdAt: new Date(message.createdAt) });

async function recall(input) {
  // One thread, turn after turn, in one InMemoryStore: recall (Memory's input pipeline), then store the
  // turn's messages as its output processor would. Prints what each turn recalled and trimmed.
  const { MessageList } = await load('@mastra/core/agent');
  const { RequestContext } = await load('@mastra/core/request-context');
  const { InMemoryStore } = await load('@mastra/core/storage');
  const { getMemoryTokenBoundary, advanceMemoryTokenBoundary } = await boundaryHelpers();
  const store = new InMemoryStore();
  const memory = await store.getStore('memory');
  const { threadId, resourceId } = input;
  const now = new Date(input.turns[0][0].createdAt);
  await memory.saveThread({ thread: { id: threadId, resourceId, title: '', metadata: {}, createdAt: now, updatedAt: now } });
  const tokenLimit = input.maxTokens === null ? undefined : { maxTokens: input.maxTokens, atMaxRemoveTokens: input.atMaxRemoveTokens };
  const counter = tokenLimit ? new TokenLimiterProcessor(tokenLimit.maxTokens) : undefined;
  const abort = () => { throw new Error('abort'); };
  const out = [];
  for (const turn of input.turns) {
    const thread = await memory.getThreadById({ threadId });
    const requestContext = new RequestContext();
    requestContext.set('MastraMemory', { thread, resourceId, memoryConfig: { readOnly: input.readOnly === true } });
    const list = new MessageList({ threadId, resourceId });
    for (const text of input.systems ?? []) list.addSystem(text);
    list.add(withDate(turn[0]), 'input');
    const history = new MessageHistory({ storage: memory, lastMessages: input.lastMessages, tokenLimit, tokenCounter: counter });
    await history.processInput({ messageList: list, messages: [], requestContext, abort });
    const loaded = list.get.all.db().map((m) => m.id);
    let trimmed = [];
    if (tokenLimit) {
      // Memory.getInputProcessors' memory-only limiter and its onMemoryTrim, as 1.71 wires them.
      const limiter = new TokenLimiterProcessor({
        limit: tokenLimit.maxTokens,
        trimMode: 'memory-only',
        atMaxRemoveTokens: tokenLimit.atMaxRemoveTokens,
        tokenCounter: counter,
        onMemoryTrim: async (removed) => {
          trimmed = removed.map((m) => m.id);
          if (input.readOnly) return;
          const local = removed.filter((m) => m.threadId === threadId);
          if (!local.length) return;
          await memory.updateThreadMetadata({
            id: threadId,
            resourceId,
            update: (latest) => {
              const stored = getMemoryTokenBoundary(latest);
              const previous = stored?.maxTokens === tokenLimit.maxTokens && stored.atMaxRemoveTokens === tokenLimit.atMaxRemoveTokens ? stored : undefined;
              const boundary = advanceMemoryTokenBoundary(previous, local, tokenLimit.maxTokens, tokenLimit.atMaxRemoveTokens);
              return boundary === previous ? undefined : { memoryTokenLimiter: boundary };
            },
          });
        },
      });
      await limiter.processInput({ messageList: list, messages: [], requestContext, abort });
    }
    const after = await memory.getThreadById({ threadId });
    out.push({
      loaded,
      context: list.get.all.db().map((m) => m.id),
      trimmed,
      boundary: after?.metadata?.memoryTokenLimiter ?? null,
    });
    await memory.saveMessages({ messages: turn.map(withDate) });
  }
  return { version, turns: out };
}

// Memory's own boundary helpers (exported by @mastra/core/memory), as its onMemoryTrim uses them.
async function boundaryHelpers() {
  const { getMemoryTokenBoundary, advanceMemoryTokenBoundary } = await load('@mastra/core/memory');
  return { getMemoryTokenBoundary, advanceMemoryTokenBoundary };
}

async function filter(input) {
  // Per case: a fresh InMemoryStore holding `stored`, the case's input in a MessageList, MemoryInputFilter,
  // then the input as the filter leaves it.
  const { MessageList } = await load('@mastra/core/agent');
  const { RequestContext } = await load('@mastra/core/request-context');
  const { InMemoryStore } = await load('@mastra/core/storage');
  const { MemoryInputFilter } = await load('@mastra/core/processors');
  const out = [];
  for (const c of input.cases) {
    const store = new InMemoryStore();
    const memory = await store.getStore('memory');
    const now = new Date('2025-03-01T00:00:00.000Z');
    await memory.saveThread({ thread: { id: c.threadId, resourceId: c.resourceId, title: '', metadata: {}, createdAt: now, updatedAt: now } });
    if (c.stored.length) await memory.saveMessages({ messages: c.stored.map(withDate) });
    const requestContext = new RequestContext();
    requestContext.set('MastraMemory', { thread: { id: c.threadId }, resourceId: c.resourceId });
    const list = new MessageList({ threadId: c.threadId, resourceId: c.resourceId });
    for (const message of c.input) list.add(withDate(message), 'input');
    await new MemoryInputFilter({ storage: memory }).processInput({ messageList: list, requestContext });
    out.push(list.get.input.db().map((m) => ({ id: m.id, parts: m.content.parts })));
  }
  return { version, cases: out };
}

async function persist(input) {
  // Per case: an InMemoryStore holding `stored`; Memory's pipeline for one turn without a budget
  // (MemoryInputFilter, MessageHistory recall), the `response` added as the model's output, then
  // MessageHistory.processOutputResult; prints the stored rows (ids and parts) after the turn.
  const { MessageList } = await load('@mastra/core/agent');
  const { RequestContext } = await load('@mastra/core/request-context');
  const { InMemoryStore } = await load('@mastra/core/storage');
  const { MemoryInputFilter } = await load('@mastra/core/processors');
  const out = [];
  for (const c of input.cases) {
    const store = new InMemoryStore();
    const memory = await store.getStore('memory');
    const now = new Date('2025-03-01T00:00:00.000Z');
    await memory.saveThread({ thread: { id: 't', resourceId: 'r', title: '', metadata: {}, createdAt: now, updatedAt: now } });
    if (c.stored.length) await memory.saveMessages({ messages: c.stored.map(withDate) });
    const requestContext = new RequestContext();
    requestContext.set('MastraMemory', { thread: { id: 't' }, resourceId: 'r', memoryConfig: {} });
    const list = new MessageList({ threadId: 't', resourceId: 'r' });
    for (const message of c.input) list.add(withDate(message), 'input');
    const abort = () => { throw new Error('abort'); };
    await new MemoryInputFilter({ storage: memory }).processInput({ messageList: list, requestContext });
    const history = new MessageHistory({ storage: memory, lastMessages: 40 });
    await history.processInput({ messageList: list, messages: [], requestContext, abort });
    for (const message of c.response) list.add(withDate(message), 'response');
    await history.processOutputResult({ messageList: list, messages: [], requestContext, abort, result: { finishReason: 'stop' } });
    const rows = (await memory.listMessages({ threadId: 't', perPage: false, orderBy: { field: 'createdAt', direction: 'ASC' } })).messages;
    out.push(rows.map((m) => ({ id: m.id, parts: m.content.parts })));
  }
  return { version, cases: out };
}

const input = JSON.parse(readFileSync(0, 'utf8'));
let result;
if (command === 'tokens') result = await tokens(input);
else if (command === 'recall') result = await recall(input);
else if (command === 'filter') result = await filter(input);
else if (command === 'persist') result = await persist(input);
else {
  console.error('usage: node memory.mjs tokens|recall|filter [pkgdir]');
  process.exit(2);
}
process.stdout.write(JSON.stringify(result) + '\n');
