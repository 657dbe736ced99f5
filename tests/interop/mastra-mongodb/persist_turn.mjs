// The output step of Mastra 1.71's MessageHistory on @mastra/mongodb, for tests/interop/test_mastra_signals_interop.py.
//
//   MONGODB_URI=... node persist_turn.mjs <dbName> < {threadId, resourceId, input, response, finishReason}
//       Adds `input` then `response` to a MessageList, runs MessageHistory.processOutputResult (which filters
//       with filterMessagesForPersistence and creates the thread when it saves something), then prints
//       {thread, messages}: getThreadById and listMessages (all, createdAt ASC), as store.mjs `list` does.
import { MongoDBStore } from '@mastra/mongodb';
import { MessageList } from '@mastra/core/agent';
import { MessageHistory } from '@mastra/core/processors';
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
  const requestContext = new RequestContext();
  requestContext.set('MastraMemory', { thread: { id: threadId }, resourceId, memoryConfig: {} });
  const list = new MessageList({ threadId, resourceId });
  for (const message of input.input) list.add(withDate(message), 'input');
  for (const message of input.response) list.add(withDate(message), 'response');
  const abort = () => { throw new Error('abort'); };
  await new MessageHistory({ storage: memory }).processOutputResult({
    messageList: list, messages: [], requestContext, abort, result: { finishReason: input.finishReason },
  });
  const thread = await memory.getThreadById({ threadId });
  if (thread) delete thread._id; // Mastra leaks the ObjectId; it is not part of the thread
  const page = await memory.listMessages({ threadId, perPage: false });
  console.log(JSON.stringify({ thread, messages: page.messages }));
} finally {
  await store.close();
}
