// What Mastra 1.71 recalls from a database: its MessageHistory processor's input step on @mastra/mongodb
// 1.19, for tests/interop/test_mastra_versions_recall.py (rows written by older Mastra versions).
//
//   MONGODB_URI=... node recall.mjs <dbName> < [{threadId, resourceId, lastMessages, input?, maxTokens?,
//                                                 atMaxRemoveTokens?}, ...]
//       For each query, in order: the thread read as an Agent's turn reads it (getThreadById into the
//       request context), the turn's `input` message added, MessageHistory({lastMessages}).processInput,
//       then the list's messages as Mastra hands them to the model (`get.all.db()`: MessageList's
//       conversion of every stored shape, v1 rows included), the input left out. `lastMessages: null` is
//       Mastra's `false` (every message). With `maxTokens`: Memory's token-limited wiring (as
//       memory_turn.mjs): MessageHistory with the token limit, then the memory-only TokenLimiterProcessor
//       whose onMemoryTrim advances thread.metadata.memoryTokenLimiter. Prints [{threadId, messages,
//       trimmed}] in query order.
import { MongoDBStore } from '@mastra/mongodb';
import { MessageList } from '@mastra/core/agent';
import { getMemoryTokenBoundary, advanceMemoryTokenBoundary } from '@mastra/core/memory';
import { MessageHistory, TokenLimiterProcessor } from '@mastra/core/processors';
import { RequestContext } from '@mastra/core/request-context';

const [dbName] = process.argv.slice(2);
const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const queries = JSON.parse(Buffer.concat(chunks).toString('utf8'));

const store = new MongoDBStore({ id: 'interop', uri: process.env.MONGODB_URI, dbName, disableInit: true });
const out = [];
try {
  const memory = await store.getStore('memory');
  for (const query of queries) {
    const { threadId, resourceId, lastMessages, input, maxTokens, atMaxRemoveTokens } = query;
    const thread = await memory.getThreadById({ threadId });
    const requestContext = new RequestContext();
    requestContext.set('MastraMemory', { thread: thread ?? { id: threadId }, resourceId, memoryConfig: {} });
    const list = new MessageList({ threadId, resourceId });
    if (input) list.add({ ...input, createdAt: new Date(input.createdAt) }, 'input');
    const abort = () => { throw new Error('abort'); };
    let trimmed = [];
    if (maxTokens == null) {
      await new MessageHistory({ storage: memory, lastMessages: lastMessages ?? false })
        .processInput({ messageList: list, messages: [], requestContext, abort });
    } else {
      const tokenLimit = { maxTokens, atMaxRemoveTokens };
      const counter = new TokenLimiterProcessor(maxTokens);
      await new MessageHistory({ storage: memory, lastMessages: lastMessages ?? false, tokenLimit, tokenCounter: counter })
        .processInput({ messageList: list, messages: [], requestContext, abort });
      const limiter = new TokenLimiterProcessor({
        limit: maxTokens,
        trimMode: 'memory-only',
        atMaxRemoveTokens,
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
              const previous = stored?.maxTokens === maxTokens && stored.atMaxRemoveTokens === atMaxRemoveTokens ? stored : undefined;
              const boundary = advanceMemoryTokenBoundary(previous, local, maxTokens, atMaxRemoveTokens);
              return boundary === previous ? undefined : { memoryTokenLimiter: boundary };
            },
          });
        },
      });
      await limiter.processInput({ messageList: list, messages: [], requestContext, abort });
    }
    const messages = list.get.all.db().filter((m) => !input || m.id !== input.id);
    out.push({ threadId, messages, trimmed });
  }
} finally {
  await store.close();
}
console.log(JSON.stringify(out));
