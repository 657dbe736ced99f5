// One turn of Mastra 1.71's Memory input pipeline on @mastra/mongodb, for
// tests/interop/test_mastra_memory_mongodb_interop.py (a Mastra app and the service alternating turns).
//
//   MONGODB_URI=... node memory_turn.mjs <dbName> < {threadId, resourceId, turn, lastMessages, maxTokens,
//                                                     atMaxRemoveTokens}
//       Creates the thread if missing (as Mastra's Agent does before any processor), runs MessageHistory with
//       the token limit and the default counter, then the memory-only TokenLimiterProcessor whose
//       onMemoryTrim advances thread.metadata.memoryTokenLimiter (Memory.getInputProcessors' wiring), then
//       saves the turn's messages. Prints {context, trimmed, boundary}.
import { MongoDBStore } from '@mastra/mongodb';
import { MessageList } from '@mastra/core/agent';
import { getMemoryTokenBoundary, advanceMemoryTokenBoundary } from '@mastra/core/memory';
import { MessageHistory, TokenLimiterProcessor } from '@mastra/core/processors';
import { RequestContext } from '@mastra/core/request-context';

const [dbName] = process.argv.slice(2);
const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const input = JSON.parse(Buffer.concat(chunks).toString('utf8'));
const withDate = (m) => ({ ...m, createdAt: new Date(m.createdAt) });

const store = new MongoDBStore({ id: 'interop', uri: process.env.MONGODB_URI, dbName, disableInit: true });
try {
  const memory = await store.getStore('memory');
  const { threadId, resourceId } = input;
  let thread = await memory.getThreadById({ threadId });
  if (!thread) {
    const now = new Date(input.turn[0].createdAt);
    await memory.saveThread({ thread: { id: threadId, resourceId, title: '', metadata: {}, createdAt: now, updatedAt: now } });
    thread = await memory.getThreadById({ threadId });
  }
  const tokenLimit = { maxTokens: input.maxTokens, atMaxRemoveTokens: input.atMaxRemoveTokens };
  const counter = new TokenLimiterProcessor(tokenLimit.maxTokens);
  const requestContext = new RequestContext();
  requestContext.set('MastraMemory', { thread, resourceId, memoryConfig: {} });
  const list = new MessageList({ threadId, resourceId });
  list.add(withDate(input.turn[0]), 'input');
  const abort = () => { throw new Error('abort'); };
  await new MessageHistory({ storage: memory, lastMessages: input.lastMessages, tokenLimit, tokenCounter: counter })
    .processInput({ messageList: list, messages: [], requestContext, abort });
  let trimmed = [];
  const limiter = new TokenLimiterProcessor({
    limit: tokenLimit.maxTokens,
    trimMode: 'memory-only',
    atMaxRemoveTokens: tokenLimit.atMaxRemoveTokens,
    tokenCounter: counter,
    onMemoryTrim: async (removed) => {
      trimmed = removed.map((m) => m.id);
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
  const context = list.get.all.db().map((m) => m.id);
  await memory.saveMessages({ messages: input.turn.map(withDate) });
  const after = await memory.getThreadById({ threadId });
  console.log(JSON.stringify({ context, trimmed, boundary: after?.metadata?.memoryTokenLimiter ?? null }));
} finally {
  await store.close();
}
