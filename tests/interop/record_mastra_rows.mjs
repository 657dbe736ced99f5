// Writes one scripted conversation through a published Mastra version's own memory API into a fresh
// database, for tests/interop/record_mastra_rows.py (which installs the version, runs this file from the
// version's directory so its imports resolve there, and dumps the rows into tests/data/mastra_versions/).
//
//   MONGODB_URI=... node record_mastra_rows.mjs <dbName> <label>
//
// The same conversation on every version, so the corpus differs only by what each version writes:
//   - `Memory.saveThread` for four threads of two resources (titles, metadata);
//   - `Memory.saveMessages` of a turn-rich conversation, built the way an Agent builds it: AI SDK messages
//     (user text, assistant text + tool call, a `tool` message with its result, a final answer) added to
//     Mastra's own `MessageList` and saved as the list gives them (v2 / db messages);
//   - on 0.x, the store's `saveMessages` with `format: 'v1'` as well: the v1 rows (role `tool`, content as an
//     array or a string, `type` `text` / `tool-call` / `tool-result`) Mastra's memory wrote before v2;
//   - on 1.x, one turn through the `MessageHistory` processor's output step (`processOutputResult`), as an
//     Agent with memory persists a response.
// Prints {label, saved: [...ids]}.
import { MongoDBStore } from '@mastra/mongodb';
import { Memory } from '@mastra/memory';
import { MessageList } from '@mastra/core/agent';

const [dbName, label] = process.argv.slice(2);
const uri = process.env.MONGODB_URI;
if (!uri || !dbName || !label) {
  console.error('usage: MONGODB_URI=... node record_mastra_rows.mjs <dbName> <label>');
  process.exit(2);
}
const major = Number(label.split('.')[0]);
const T0 = Date.parse('2025-03-01T09:00:00.000Z');
const at = (seconds) => new Date(T0 + seconds * 1000);
const tag = label.replace(/\./g, '_');
const thread = (name) => `t-${tag}-${name}`;
const alice = `r-${tag}-alice`;
const bob = `r-${tag}-bob`;

// url for @mastra/mongodb 0.x / 1.0, uri for 1.19
const store = new MongoDBStore({ id: 'recorder', url: uri, uri, dbName });
const saved = [];
try {
  if (typeof store.init === 'function') await store.init();
  const rows = typeof store.getStore === 'function' ? (await store.getStore('memory')) ?? store : store;
  const memory = new Memory({ storage: store, options: { lastMessages: 40 } });

  const threads = [
    { id: thread('weather'), resourceId: alice, title: 'Weather', metadata: { topic: 'weather', n: 1 } },
    { id: thread('notes'), resourceId: alice, title: '', metadata: {} },
    { id: thread('bob'), resourceId: bob, title: 'Bob ✓', metadata: { nested: { list: [1, 'two', null] } } },
    { id: thread('media'), resourceId: bob, title: 'Pictures', metadata: {} },
  ];
  for (const [i, t] of threads.entries()) {
    await memory.saveThread({ thread: { ...t, createdAt: at(i), updatedAt: at(i) } });
  }

  // AI SDK (v4 core) messages, as a model's turn has them; ids and dates fixed so every version's rows line up.
  const weather = [
    { role: 'user', content: 'Weather in Oslo?' },
    {
      role: 'assistant',
      content: [
        { type: 'text', text: 'Let me check.' },
        { type: 'tool-call', toolCallId: 'call-1', toolName: 'weather', args: { city: 'Oslo' } },
      ],
    },
    {
      role: 'tool',
      content: [{ type: 'tool-result', toolCallId: 'call-1', toolName: 'weather', result: { tempC: -3 } }],
    },
    { role: 'assistant', content: 'It is -3 °C in Oslo. ❄️' },
    { role: 'user', content: [{ type: 'text', text: 'And "Bergen"?\\ tab\there\nnew line' }] },
    { role: 'assistant', content: [{ type: 'text', text: 'Rain, as always. 😀' }] },
  ];
  const notes = [
    { role: 'user', content: 'Remember: milk, eggs.' },
    { role: 'assistant', content: 'Noted: milk, eggs.' },
    { role: 'user', content: 'What did I ask you to remember?' },
    { role: 'assistant', content: 'Milk and eggs.' },
  ];
  const bobs = [
    { role: 'user', content: 'Add 2 and 3.' },
    {
      role: 'assistant',
      content: [{ type: 'tool-call', toolCallId: 'call-b1', toolName: 'add', args: { a: 2, b: 3 } }],
    },
    { role: 'tool', content: [{ type: 'tool-result', toolCallId: 'call-b1', toolName: 'add', result: 5 }] },
    { role: 'assistant', content: '2 + 3 = 5.' },
  ];

  const media = [
    {
      role: 'user',
      content: [
        { type: 'text', text: 'What is in this picture?' },
        { type: 'image', image: 'https://example.com/cat.png', mimeType: 'image/png' },
        { type: 'file', data: 'aGVsbG8=', mimeType: 'text/plain' },
      ],
    },
    {
      role: 'assistant',
      content: [
        { type: 'reasoning', text: 'It looks like a cat.', signature: 'sig-1' },
        { type: 'text', text: 'A cat, and a file saying hello.' },
      ],
    },
  ];
  const asDb = (messages, threadId, resourceId, start) => {
    const list = new MessageList({ threadId, resourceId });
    messages.forEach((m, i) => {
      const withMeta = { ...m, id: `${threadId}-m${String(i).padStart(2, '0')}`, createdAt: at(start + i) };
      // 0.10's MessageList calls a user's message source `user`, later versions `input`
      list.add(withMeta, m.role !== 'user' ? 'response' : label === '0.10' ? 'user' : 'input');
    });
    const all = list.get.all;
    return (typeof all.db === 'function' ? all.db() : all.v2()).map((m) => ({ ...m, threadId, resourceId }));
  };

  const convs = [
    [weather, thread('weather'), alice, 10],
    [notes, thread('notes'), alice, 100],
    [bobs, thread('bob'), bob, 200],
    [media, thread('media'), bob, 400],
  ];
  for (const [messages, threadId, resourceId, start] of convs) {
    const result = await memory.saveMessages({ messages: asDb(messages, threadId, resourceId, start), format: 'v2' });
    const list = Array.isArray(result) ? result : result.messages;
    saved.push(...list.map((m) => m.id));
  }

  if (major === 0) {
    // The v1 rows of Mastra's memory before v2, through the store's own v1 path.
    const v1Thread = thread('v1');
    await memory.saveThread({
      thread: { id: v1Thread, resourceId: alice, title: 'v1', metadata: {}, createdAt: at(300), updatedAt: at(300) },
    });
    const base = { threadId: v1Thread, resourceId: alice };
    const v1 = [
      { role: 'user', type: 'text', content: 'Convert 10 EUR to NOK.' },
      {
        role: 'assistant',
        type: 'tool-call',
        content: [
          { type: 'text', text: 'Converting.' },
          { type: 'tool-call', toolCallId: 'call-v1', toolName: 'fx', args: { amount: 10, from: 'EUR', to: 'NOK' } },
        ],
        toolCallIds: ['call-v1'],
        toolNames: ['fx'],
        toolCallArgs: [{ amount: 10, from: 'EUR', to: 'NOK' }],
      },
      {
        role: 'tool',
        type: 'tool-result',
        content: [{ type: 'tool-result', toolCallId: 'call-v1', toolName: 'fx', result: { nok: 117.5 } }],
      },
      { role: 'assistant', type: 'text', content: [{ type: 'text', text: '10 EUR is 117.50 NOK.' }] },
      { role: 'user', type: 'text', content: [{ type: 'text', text: 'Thanks!' }] },
      { role: 'assistant', type: 'text', content: 'You are welcome.' },
    ].map((m, i) => ({ ...base, ...m, id: `${v1Thread}-m${String(i).padStart(2, '0')}`, createdAt: at(301 + i) }));
    await rows.saveMessages({ messages: v1, format: 'v1' });
    saved.push(...v1.map((m) => m.id));
  } else {
    // One turn as an Agent with memory persists it: the MessageHistory processor's output step.
    const { MessageHistory } = await import('@mastra/core/processors');
    const { RequestContext } = await import('@mastra/core/request-context');
    const threadId = thread('bob');
    const requestContext = new RequestContext();
    requestContext.set('MastraMemory', { thread: { id: threadId }, resourceId: bob, memoryConfig: {} });
    const list = new MessageList({ threadId, resourceId: bob });
    list.add({ id: `${threadId}-turn-u`, role: 'user', content: 'And 5 times 7?', createdAt: at(250) }, 'input');
    list.add({ id: `${threadId}-turn-a`, role: 'assistant', content: '5 × 7 = 35.', createdAt: at(251) }, 'response');
    const abort = () => { throw new Error('abort'); };
    await new MessageHistory({ storage: rows }).processOutputResult({
      messageList: list, messages: [], requestContext, abort, result: { finishReason: 'stop' },
    });
    saved.push(`${threadId}-turn-u`, `${threadId}-turn-a`);
  }
  console.log(JSON.stringify({ label, saved }));
} finally {
  await store.close();
}
