// What Mastra 1.71 recalls from a database: its MessageHistory processor's input step on @mastra/mongodb
// 1.19, for tests/interop/test_mastra_versions_recall.py (rows written by older Mastra versions).
//
//   MONGODB_URI=... node recall.mjs <dbName> < [{threadId, resourceId, lastMessages}, ...]
//       For each query: the thread read as an Agent's turn reads it (getThreadById into the request
//       context), MessageHistory({lastMessages}).processInput on an empty MessageList, then the list's
//       messages as Mastra hands them to the model's context (`get.all.db()`: MessageList's conversion of
//       every stored shape, v1 rows included). `lastMessages: null` is Mastra's `false` (every message).
//       Prints [{threadId, messages}] in query order.
import { MongoDBStore } from '@mastra/mongodb';
import { MessageList } from '@mastra/core/agent';
import { MessageHistory } from '@mastra/core/processors';
import { RequestContext } from '@mastra/core/request-context';

const [dbName] = process.argv.slice(2);
const chunks = [];
for await (const chunk of process.stdin) chunks.push(chunk);
const queries = JSON.parse(Buffer.concat(chunks).toString('utf8'));

const store = new MongoDBStore({ id: 'interop', uri: process.env.MONGODB_URI, dbName, disableInit: true });
const out = [];
try {
  const memory = await store.getStore('memory');
  for (const { threadId, resourceId, lastMessages } of queries) {
    const thread = await memory.getThreadById({ threadId });
    const requestContext = new RequestContext();
    requestContext.set('MastraMemory', { thread: thread ?? { id: threadId }, resourceId, memoryConfig: {} });
    const list = new MessageList({ threadId, resourceId });
    const abort = () => { throw new Error('abort'); };
    await new MessageHistory({ storage: memory, lastMessages: lastMessages ?? false })
      .processInput({ messageList: list, messages: [], requestContext, abort });
    out.push({ threadId, messages: list.get.all.db() });
  }
} finally {
  await store.close();
}
console.log(JSON.stringify(out));
