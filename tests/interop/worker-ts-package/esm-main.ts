// The fresh ESM project's program (tests/interop/test_worker_ts_package.py).
import { Agent } from '@mastra/core/agent';
import { AgentWorker, buildResponse, Turn, type EnrichedRequest, type Handler } from '@message-history/worker';
import { mastraHandler } from '@message-history/worker/mastra';
import { TestHarness, text } from '@message-history/worker/testing';

// A Mastra Agent without memory; the model is any Mastra model (a provider's, or a router id like this one).
const agent = new Agent({ id: 'assistant', name: 'assistant', instructions: 'Answer briefly.', model: 'openai/gpt-4o-mini' });
const viaMastra = mastraHandler(agent);
const echo: Handler = async (turn) => `echo: ${turn.input.length} message(s) on ${turn.threadId}`;
const worker = new AgentWorker(echo, { brokers: ['127.0.0.1:9'], groupId: 'g', handleSignals: false });
const event = JSON.parse(process.argv[2] ?? '{}') as EnrichedRequest;
const turn = new Turn(event);
const response = buildResponse(turn, await echo(turn));
const [tested] = await new TestHarness(echo).send({ threadId: 't2', text: 'hi' });
const testing = text(tested!.response);
console.log(JSON.stringify({ module: 'esm', testing, run: typeof worker.run, mastra: typeof viaMastra, response }));
