// Drives @mastra/mongodb's own MongoDBStore against a database, for tests/interop/test_mastra_mongodb_interop.py.
//
//   MONGODB_URI=... node store.mjs <dbName> init
//       Mastra's init(): creates its collections and default indexes.
//   MONGODB_URI=... node store.mjs <dbName> list <threadId> [resourceId]
//       Prints {thread, messages}: getThreadById and listMessages (perPage false = all, createdAt ASC).
//   MONGODB_URI=... node store.mjs <dbName> save < {thread, messages}
//       saveThread (when `thread` is given) then saveMessages; ISO dates become Date. Prints {saved}.
//   MONGODB_URI=... node store.mjs <dbName> persist < {threadId, resourceId, input, response, finishReason}
//       The output step of Mastra's MessageHistory: `input` then `response` added to a MessageList, then
//       processOutputResult (filterMessagesForPersistence; creates the thread when it saves something).
//       With `recall: N`, MessageHistory's input step first loads the thread's last N stored messages into
//       the list (as an Agent's turn has them), so a response can merge into the latest stored message.
//       Prints {thread, messages} as `list` does.
//
// disableInit keeps list/save from creating indexes, so the test decides who creates them and when.
import { MongoDBStore } from '@mastra/mongodb';

const [dbName, command, ...args] = process.argv.slice(2);
const uri = process.env.MONGODB_URI;
if (!uri || !dbName || !command) {
  console.error('usage: MONGODB_URI=... node store.mjs <dbName> init|list|save|persist ...');
  process.exit(2);
}

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString('utf8'));
}

const asDate = (value) => (typeof value === 'string' ? new Date(value) : value);

async function listThread(memory, threadId, resourceId) {
  const thread = await memory.getThreadById({ threadId, ...(resourceId ? { resourceId } : {}) });
  const page = await memory.listMessages({ threadId, ...(resourceId ? { resourceId } : {}), perPage: false });
  if (thread) delete thread._id; // Mastra leaks the ObjectId; it is not part of the thread
  return { thread, messages: page.messages, total: page.total };
}

async function persist(memory, input) {
  const { MessageList } = await import('@mastra/core/agent');
  const { MessageHistory } = await import('@mastra/core/processors');
  const { RequestContext } = await import('@mastra/core/request-context');
  const { threadId, resourceId } = input;
  const requestContext = new RequestContext();
  requestContext.set('MastraMemory', { thread: { id: threadId }, resourceId, memoryConfig: {} });
  const list = new MessageList({ threadId, resourceId });
  const withDate = (m) => ({ ...m, createdAt: asDate(m.createdAt) });
  const abort = () => { throw new Error('abort'); };
  if (input.recall) {
    await new MessageHistory({ storage: memory, lastMessages: input.recall })
      .processInput({ messageList: list, messages: [], requestContext, abort });
  }
  for (const message of input.input) list.add(withDate(message), 'input');
  for (const message of input.response) list.add(withDate(message), 'response');
  await new MessageHistory({ storage: memory }).processOutputResult({
    messageList: list, messages: [], requestContext, abort, result: { finishReason: input.finishReason },
  });
  return listThread(memory, threadId);
}

const store = new MongoDBStore({ id: 'interop', uri, dbName, disableInit: command !== 'init' });
try {
  if (command === 'init') {
    await store.init();
    console.log(JSON.stringify({ ok: true }));
  } else {
    const memory = await store.getStore('memory');
    if (command === 'list') {
      const [threadId, resourceId] = args;
      console.log(JSON.stringify(await listThread(memory, threadId, resourceId)));
    } else if (command === 'persist') {
      console.log(JSON.stringify(await persist(memory, await readStdin())));
    } else if (command === 'save') {
      const input = await readStdin();
      if (input.thread) {
        const t = input.thread;
        await memory.saveThread({ thread: { ...t, createdAt: asDate(t.createdAt), updatedAt: asDate(t.updatedAt) } });
      }
      const messages = input.messages.map((m) => ({ ...m, createdAt: asDate(m.createdAt) }));
      const result = await memory.saveMessages({ messages });
      console.log(JSON.stringify({ saved: result.messages.map((m) => m.id) }));
    } else {
      throw new Error(`unknown command ${command}`);
    }
  }
} finally {
  await store.close();
}
