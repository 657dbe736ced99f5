// The anchor: Mastra's own MessageHistory processor (@mastra/core) over @mastra/mongodb, in one Node process,
// driven by the benchmark harness (bench/anchor.py) on the same turns and the same database as the service.
//
//   node bench.mjs recall  CONFIG.json   processInput for every turn: recall the thread's last N messages
//   node bench.mjs persist CONFIG.json   processOutputResult for every turn: save its input + response
//   node bench.mjs memory  CONFIG.json   the whole turn on Mastra's InMemoryStore, no database: processInput,
//                                        then the response added and processOutputResult (one recall + one save)
//
// CONFIG: {mongoUri, dbName, lastMessages, concurrency, seconds, turnsFile, latencyTurnsFile, latencySeconds}
// (`memory` also: historyFile, JSON lines {threadId, resourceId, messages}, the seeded history). A turns file
// is JSON lines {threadId, resourceId, input, response} (MastraDBMessage objects). Throughput phase: every
// turn of turnsFile, `concurrency` turns in flight (a Node server serves many requests at once), until
// done or `seconds` elapsed; then the latency phase: latencyTurnsFile one turn at a time (at least 3, then
// until `latencySeconds`). Prints one JSON
// object on stdout: events, wall_s, cpu_s (this process, user + system), peak_rss_bytes, latencies_ms
// (the sequential phase), version. "@@bench start" / "@@bench end" on stderr frame the throughput phase.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { performance } from 'node:perf_hooks';

const require = createRequire(import.meta.url);
const { MessageList } = await import('@mastra/core/agent');
const { MessageHistory } = await import('@mastra/core/processors');
const { RequestContext } = await import('@mastra/core/request-context');
const { InMemoryStore } = await import('@mastra/core/storage');
const version = {
  core: JSON.parse(readFileSync(require.resolve('@mastra/core/package.json'), 'utf8')).version,
  mongodb: JSON.parse(readFileSync(require.resolve('@mastra/mongodb/package.json'), 'utf8')).version,
};

const [path, configFile] = process.argv.slice(2);
const config = JSON.parse(readFileSync(configFile, 'utf8'));
const readTurns = (file) =>
  readFileSync(file, 'utf8')
    .split('\n')
    .filter((line) => line.trim())
    .map((line) => JSON.parse(line));

const abort = (reason) => {
  throw new Error(`aborted: ${reason}`);
};

const asDb = (message) => ({ ...message, createdAt: new Date(message.createdAt) });

function context(turn) {
  const requestContext = new RequestContext();
  requestContext.set('MastraMemory', { thread: { id: turn.threadId }, resourceId: turn.resourceId });
  return requestContext;
}

async function recall(processor, turn) {
  const messageList = new MessageList({ threadId: turn.threadId, resourceId: turn.resourceId });
  messageList.add(asDb(turn.input), 'input');
  await processor.processInput({ messages: [], messageList, abort, requestContext: context(turn) });
  return messageList.get.all.db().length;
}

async function persist(processor, turn) {
  const messageList = new MessageList({ threadId: turn.threadId, resourceId: turn.resourceId });
  messageList.add(asDb(turn.input), 'input');
  messageList.add(asDb(turn.response), 'response');
  await processor.processOutputResult({
    messages: [],
    messageList,
    abort,
    requestContext: context(turn),
    result: { finishReason: 'stop' },
  });
  return 2;
}

// The whole turn in process: recall into the turn's MessageList, the model's reply added, the turn saved.
async function wholeTurn(processors, turn) {
  const processor = processors.get(turn.threadId);
  const requestContext = context(turn);
  const messageList = new MessageList({ threadId: turn.threadId, resourceId: turn.resourceId });
  messageList.add(asDb(turn.input), 'input');
  await processor.processInput({ messages: [], messageList, abort, requestContext });
  const recalled = messageList.get.all.db().length;
  messageList.add(asDb(turn.response), 'response');
  await processor.processOutputResult({ messages: [], messageList, abort, requestContext, result: { finishReason: 'stop' } });
  return recalled;
}

// One InMemoryStore per thread: its `listMessages` filters every stored message of the store (no index), so one
// shared store would make the anchor cost grow with the workload's total history; per thread it reads only the
// thread's own rows, as an indexed database does, and the figure is the processor's own cost.
async function memoryProcessors() {
  const processors = new Map();
  for (const row of readTurns(config.historyFile)) {
    const store = new InMemoryStore();
    const memory = await store.getStore('memory');
    const first = row.messages.length ? new Date(row.messages[0].createdAt) : new Date(0);
    const last = row.messages.length ? new Date(row.messages.at(-1).createdAt) : first;
    const thread = { id: row.threadId, resourceId: row.resourceId, title: '', metadata: {}, createdAt: first, updatedAt: last };
    await memory.saveThread({ thread });
    if (row.messages.length) await memory.saveMessages({ messages: row.messages.map(asDb) });
    processors.set(row.threadId, new MessageHistory({ storage: memory, lastMessages: config.lastMessages }));
  }
  return { processors, close: async () => {} };
}

async function mongoProcessor() {
  const { MongoDBStore } = await import('@mastra/mongodb');
  const store = new MongoDBStore({ id: 'bench', uri: config.mongoUri, dbName: config.dbName, disableInit: true });
  const memory = await store.getStore('memory');
  const processor = new MessageHistory({ storage: memory, lastMessages: config.lastMessages });
  return { processors: { get: () => processor }, close: () => store.close() };
}

const cpuSeconds = (usage) => (usage.user + usage.system) / 1e6;

async function main() {
  const { processors, close } = path === 'memory' ? await memoryProcessors() : await mongoProcessor();
  const steps = { recall, persist };
  const step = path === 'memory' ? (turn) => wholeTurn(processors, turn) : (turn) => steps[path](processors.get(), turn);
  const turns = readTurns(config.turnsFile);
  const latencyTurns = readTurns(config.latencyTurnsFile);

  // warm-up, not measured: V8 compiles the hot paths after some hundreds of calls, and the service's lines
  // are measured warm too (after their warm-up event, with CPython's caches filled)
  const warmupTurns = config.warmupTurnsFile ? readTurns(config.warmupTurnsFile) : [];
  const warmupDeadline = performance.now() + (config.warmupSeconds ?? 0) * 1000;
  let warmedUp = 0;
  for (const turn of warmupTurns) {
    if (performance.now() > warmupDeadline) break;
    await step(turn);
    warmedUp += 1;
  }

  // throughput: `concurrency` workers pulling turns until done or out of time
  let next = 0;
  let done = 0;
  let messages = 0;
  const deadline = performance.now() + config.seconds * 1000;
  console.error('@@bench start');
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  const worker = async () => {
    while (next < turns.length && performance.now() < deadline) {
      const turn = turns[next++];
      const counted = await step(turn); // not `messages += await ...`: that reads before awaiting
      messages += counted;
      done += 1;
      if (done % 500 === 0) console.error(`[mastra] ${path}: ${done}/${turns.length}`);
    }
  };
  await Promise.all(Array.from({ length: config.concurrency }, worker));
  const wall = (performance.now() - t0) / 1000;
  const cpu = cpuSeconds(process.cpuUsage(cpu0));
  console.error('@@bench end');

  // latency: one turn at a time, nothing else running
  const latencies = [];
  const latencyDeadline = performance.now() + config.latencySeconds * 1000;
  for (const turn of latencyTurns) {
    if (latencies.length >= 3 && performance.now() > latencyDeadline) break;
    const started = performance.now();
    await step(turn);
    latencies.push(performance.now() - started);
  }
  await close();
  const result = {
    events: done,
    wall_s: wall,
    cpu_s: cpu,
    peak_rss_bytes: process.resourceUsage().maxRSS * 1024,
    latencies_ms: latencies,
    details: { messages_in_context_or_saved: messages, concurrency: config.concurrency, warmup_turns: warmedUp, version, store: path === 'memory' ? 'InMemoryStore per thread' : '@mastra/mongodb' },
  };
  process.stdout.write(JSON.stringify(result) + '\n');
}

await main();
