// A Mastra agent as a message-history worker, through the TypeScript worker package (worker-ts/,
// `@message-history/worker`): EnrichedRequest in (agent.requests.enriched), AgentResponse out (agent.responses).
// The package does ids, `input` with `source`, failed turns, duplicates by eventId, commits after the
// acknowledged response and SIGTERM; the Agent runs WITHOUT Mastra `memory` (the service recalls and saves).
//
//   KAFKA_BOOTSTRAP_SERVERS=127.0.0.1:9092 node dist/worker.js
//
// Environment: KAFKA_BOOTSTRAP_SERVERS, MESSAGE_HISTORY_ENRICHED_TOPIC, MESSAGE_HISTORY_RESPONSES_TOPIC (the
// service's names and defaults), WORKER_GROUP_ID (default `mastra-agent-worker`). One JSON line per turn.
import { Agent } from '@mastra/core/agent';
import { AgentWorker } from '@message-history/worker';
import { mastraHandler } from '@message-history/worker/mastra';

import { prompts, stubModel } from './stub-model.js';

const say = (line: Record<string, unknown>): void => {
  process.stdout.write(JSON.stringify(line) + '\n');
};

// No `memory` here, on purpose: mastraHandler refuses an Agent that has it.
const agent = new Agent({
  id: 'assistant',
  name: 'assistant',
  instructions: 'You are a helpful assistant. Answer briefly.',
  model: stubModel, // put your provider's model here: openai('gpt-4o'), ...
});

const worker = AgentWorker.fromEnv(mastraHandler(agent), {
  groupId: process.env.WORKER_GROUP_ID || 'mastra-agent-worker',
});
worker.on('answered', ({ turn, response }) =>
  say({
    event: 'answered',
    requestId: turn.requestId,
    recalled: turn.history.recalled,
    promptMessages: prompts.at(-1)?.length ?? 0,
    finishReason: response.finishReason,
  }),
);
await worker.run(); // until SIGTERM / SIGINT
say({ event: 'stopped', prompts: prompts.length });
