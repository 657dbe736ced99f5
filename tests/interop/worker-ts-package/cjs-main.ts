// The fresh CommonJS project's program (tests/interop/test_worker_ts_package.py).
import { TestHarness, text } from '@message-history/worker/testing';
import { AgentWorker, buildResponse, Turn, type EnrichedRequest, type Handler } from '@message-history/worker';

const echo: Handler = async (turn) => `echo: ${turn.input.length} message(s) on ${turn.threadId}`;
const worker = new AgentWorker(echo, { brokers: ['127.0.0.1:9'], groupId: 'g', handleSignals: false });

async function main(): Promise<void> {
  const event = JSON.parse(process.argv[2] ?? '{}') as EnrichedRequest;
  const turn = new Turn(event);
  const response = buildResponse(turn, await echo(turn));
  // compiled to require(): the package's CommonJS build; the ./mastra entry point must load there too
  const mastra = require('@message-history/worker/mastra') as { mastraHandler?: unknown };
  const [tested] = await new TestHarness(echo).send({ threadId: 't2', text: 'hi' });
  const testing = text(tested!.response);
  console.log(JSON.stringify({ module: 'cjs', testing, run: typeof worker.run, mastra: typeof mastra.mastraHandler, response }));
}

void main();
