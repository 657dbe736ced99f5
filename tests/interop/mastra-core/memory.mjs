// Mastra 1.71's conversation memory, driven from tests/interop/test_mastra_memory_interop.py.
//
//   node memory.mjs tokens <pkgdir>   reads {texts, systems, messages} on stdin and prints Mastra's own counts:
//                                     tokenx's estimateTokenCount per text, countCoreSystemMessageTokens per
//                                     system text, TokenLimiterProcessor.countInputMessageTokens per message
//   node memory.mjs recall <pkgdir>   reads {threadId, resourceId, thread, stored, input, systems,
//                                     lastMessages, maxTokens, atMaxRemoveTokens} on stdin; stores the thread
//                                     and rows in Mastra's InMemoryStore, runs Memory's input pipeline
//                                     (MessageHistory with the default counter, then the memory-only
//                                     TokenLimiterProcessor with its onMemoryTrim boundary) and prints the
//                                     context ids, the trimmed ids and the thread's stored boundary
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
  const { MessageList } = await load('@mastra/core/agent');
  const { RequestContext } = await load('@mastra/core/request-context');
  const { InMemoryStore } = await load('@mastra/core/storage');
  const store = new InMemoryStore();
  const memory = await store.getStore('memory');
  if (input.thread) {
    await memory.saveThread({
      thread: { ...input.thread, createdAt: new Date(input.thread.createdAt), updatedAt: new Date(input.thread.updatedAt) },
    });
  }
  if (input.stored.length) await memory.saveMessages({ messages: input.stored.map(withDate) });
  const thread = input.thread ? await memory.getThreadById({ threadId: input.threadId }) : undefined;
  const requestContext = new RequestContext();
  requestContext.set('MastraMemory', { thread: thread ?? { id: input.threadId }, resourceId: input.resourceId, memoryConfig: { readOnly: input.readOnly === true } });
  const list = new MessageList({ threadId: input.threadId, resourceId: input.resourceId });
  for (const text of input.systems ?? []) list.addSystem(text);
  for (const message of input.input) list.add(withDate(message), 'input');
  const tokenLimit = input.maxTokens === null ? undefined : { maxTokens: input.maxTokens, atMaxRemoveTokens: input.atMaxRemoveTokens };
  const counter = tokenLimit ? new TokenLimiterProcessor(tokenLimit.maxTokens) : undefined;
  const history = new MessageHistory({ storage: memory, lastMessages: input.lastMessages, tokenLimit, tokenCounter: counter });
  await history.processInput({ messageList: list, messages: [], requestContext, abort: () => { throw new Error('abort'); } });
  const loaded = list.get.all.db().map((m) => m.id);
  let trimmed = [];
  if (tokenLimit) {
    // Memory.getInputProcessors' memory-only limiter and its onMemoryTrim, as 1.71 wires them.
    const { getMemoryTokenBoundary, advanceMemoryTokenBoundary } = await boundaryHelpers();
    const limiter = new TokenLimiterProcessor({
      limit: tokenLimit.maxTokens,
      trimMode: 'memory-only',
      atMaxRemoveTokens: tokenLimit.atMaxRemoveTokens,
      tokenCounter: counter,
      onMemoryTrim: async (removed) => {
        trimmed = removed.map((m) => m.id);
        if (!thread || input.readOnly) return;
        const local = removed.filter((m) => m.threadId === thread.id);
        if (!local.length) return;
        await memory.updateThreadMetadata({
          id: thread.id,
          resourceId: input.resourceId,
          update: (latest) => {
            const stored = getMemoryTokenBoundary(latest);
            const previous = stored?.maxTokens === tokenLimit.maxTokens && stored.atMaxRemoveTokens === tokenLimit.atMaxRemoveTokens ? stored : undefined;
            const boundary = advanceMemoryTokenBoundary(previous, local, tokenLimit.maxTokens, tokenLimit.atMaxRemoveTokens);
            return boundary === previous ? undefined : { memoryTokenLimiter: boundary };
          },
        });
      },
    });
    await limiter.processInput({ messageList: list, messages: [], requestContext, abort: () => { throw new Error('abort'); } });
  }
  const after = thread ? await memory.getThreadById({ threadId: input.threadId }) : undefined;
  return {
    version,
    loaded,
    context: list.get.all.db().map((m) => m.id),
    trimmed,
    boundary: after?.metadata?.memoryTokenLimiter ?? null,
  };
}

// The boundary helpers are internal to the bundle; Memory exposes them only through its pipeline, so they
// are read from the chunk that defines them (named exports of the chunk, found by their source names).
async function boundaryHelpers() {
  const dist = resolve(requireFrom.resolve('@mastra/core/package.json'), '..', 'dist');
  const { readdirSync } = await import('node:fs');
  for (const file of readdirSync(dist)) {
    if (!/^agent-[\w-]+\.js$/.test(file)) continue;
    const source = readFileSync(join(dist, file), 'utf8');
    const exported = source.match(/export \{([^}]*)\};\s*$/);
    if (!exported || !source.includes('function advanceMemoryTokenBoundary')) continue;
    const names = Object.fromEntries(exported[1].split(',').map((s) => s.trim().split(/\s+as\s+/)).map(([local, alias]) => [local, alias]));
    const chunk = await import(pathToFileURL(join(dist, file)).href);
    return {
      getMemoryTokenBoundary: chunk[names.getMemoryTokenBoundary],
      advanceMemoryTokenBoundary: chunk[names.advanceMemoryTokenBoundary],
    };
  }
  throw new Error('advanceMemoryTokenBoundary not found in @mastra/core dist');
}

const input = JSON.parse(readFileSync(0, 'utf8'));
let result;
if (command === 'tokens') result = await tokens(input);
else if (command === 'recall') result = await recall(input);
else {
  console.error('usage: node memory.mjs tokens|recall [pkgdir]');
  process.exit(2);
}
process.stdout.write(JSON.stringify(result) + '\n');
