// The anchor: Mastra's own MessageHistory processor (@mastra/core) over @mastra/mongodb, in one Node process,
// driven by the benchmark harness (bench/anchor.py) on the same turns and the same database as the service.
//
//   node bench.mjs recall  CONFIG.json   processInput for every turn: recall the thread's last N messages
//   node bench.mjs persist CONFIG.json   processOutputResult for every turn: save its input + response
//
// CONFIG: {mongoUri, dbName, lastMessages, concurrency, seconds, turnsFile, latencyTurnsFile, latencySeconds}. A turns file
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
const { MongoDBStore } = await import('@mastra/mongodb');
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

const cpuSeconds = (usage) => (usage.user + usage.system) / 1e6;

async function main() {
  const store = new MongoDBStore({ id: 'bench', uri: config.mongoUri, dbName: config.dbName, disableInit: true });
  const memory = await store.getStore('memory');
  const processor = new MessageHistory({ storage: memory, lastMessages: config.lastMessages });
  const step = path === 'recall' ? recall : persist;
  const turns = readTurns(config.turnsFile);
  const latencyTurns = readTurns(config.latencyTurnsFile);

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
      const counted = await step(processor, turn); // not `messages += await ...`: that reads before awaiting
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
    await step(processor, turn);
    latencies.push(performance.now() - started);
  }
  await store.close();
  const result = {
    events: done,
    wall_s: wall,
    cpu_s: cpu,
    peak_rss_bytes: process.resourceUsage().maxRSS * 1024,
    latencies_ms: latencies,
    details: { messages_in_context_or_saved: messages, concurrency: config.concurrency, version },
  };
  process.stdout.write(JSON.stringify(result) + '\n');
}

await main();
