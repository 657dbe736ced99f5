// Mastra's Observational Memory (@mastra/memory 1.31), driven from tests/interop/test_mastra_om_interop.py.
//
//   node om.mjs tokens    reads {messages, observations} on stdin; prints Mastra OM's own counts:
//                         TokenCounter.countMessage per message, countMessages of all of them, and
//                         countObservations per observation text (no model context)
//   node om.mjs context   reads {observations} on stdin; prints optimizeObservationsForContext per text and
//                         the exported context texts (prompt, instructions, continuation hint, defaults)
//   node om.mjs build     reads {cases: [{observations, now}]} on stdin; prints, per case, the system messages
//                         ObservationalMemory.buildContextSystemMessages makes of a thread-scoped record
//                         holding `observations` at `now` (run with TZ=UTC: Mastra reads dates locally)
//   node om.mjs observer-text reads {cases: [[message]]}; prints formatMessagesForObserver of each list
//                         ({maxPartLength: 500}, as the other threads' blocks of resource scope are written,
//                         unless the input's `maxPartLength` says otherwise);
//                         `build` cases may carry `others`: the unobservedContextBlocks of resource scope
//   node om.mjs wrap      reads {cases: [{existing, cycles: [{threadId, observations, lastObservedAt}]}]};
//                         prints, per case, the log a resource-scoped ObservationalMemory's wrapObservations
//                         makes of `existing` and each thread's cycle in turn
import { readFileSync } from 'node:fs';
import { InMemoryStore } from '@mastra/core/storage';
import {
  ObservationalMemory,
  TokenCounter,
  optimizeObservationsForContext,
  OBSERVATION_CONTEXT_PROMPT,
  OBSERVATION_CONTEXT_INSTRUCTIONS,
  OBSERVATION_CONTINUATION_HINT,
  OBSERVATIONAL_MEMORY_DEFAULTS,
  formatMessagesForObserver,
} from '@mastra/memory/processors';

const [command] = process.argv.slice(2);
const input = JSON.parse(readFileSync(0, 'utf8'));

if (command === 'tokens') {
  // A fresh counter per message: Mastra caches estimates on the message objects it counts.
  const clone = (m) => structuredClone(m);
  const perMessage = input.messages.map((m) => new TokenCounter().countMessage(clone(m)));
  const total = new TokenCounter().countMessages(input.messages.map(clone));
  const observations = (input.observations ?? []).map((t) => new TokenCounter().countObservations(t));
  process.stdout.write(JSON.stringify({ perMessage, total, observations }));
} else if (command === 'context') {
  process.stdout.write(
    JSON.stringify({
      optimized: (input.observations ?? []).map((t) => optimizeObservationsForContext(t)),
      prompt: OBSERVATION_CONTEXT_PROMPT,
      instructions: OBSERVATION_CONTEXT_INSTRUCTIONS,
      continuationHint: OBSERVATION_CONTINUATION_HINT,
      messageTokens: OBSERVATIONAL_MEMORY_DEFAULTS.observation.messageTokens,
      observationTokens: OBSERVATIONAL_MEMORY_DEFAULTS.reflection.observationTokens,
    }),
  );
} else if (command === 'build') {
  const memory = await new InMemoryStore().getStore('memory');
  const om = new ObservationalMemory({ storage: memory, scope: 'thread', model: 'openai/gpt-4o-mini' });
  const built = [];
  for (const { observations, now, others } of input.cases) {
    const record = { id: 'r', activeObservations: observations };
    const opts = { threadId: 't', record, currentDate: new Date(now), unobservedContextBlocks: others };
    built.push((await om.buildContextSystemMessages(opts)) ?? null);
  }
  process.stdout.write(JSON.stringify({ built }));
} else if (command === 'observer-text') {
  // formatMessagesForObserver as formatUnobservedContextBlocks calls it (createdAt a Date, as stored)
  const texts = input.cases.map((messages) =>
    formatMessagesForObserver(messages.map((m) => ({ ...m, createdAt: new Date(m.createdAt) })), {
      maxPartLength: input.maxPartLength ?? 500,
    }),
  );
  process.stdout.write(JSON.stringify({ texts }));
} else if (command === 'wrap') {
  const memory = await new InMemoryStore().getStore('memory');
  const om = new ObservationalMemory({ storage: memory, scope: 'resource', model: 'openai/gpt-4o-mini' });
  const logs = [];
  for (const { existing, cycles } of input.cases) {
    let log = existing;
    for (const { threadId, observations, lastObservedAt } of cycles) {
      log = await om.wrapObservations(observations, log, threadId, new Date(lastObservedAt));
    }
    logs.push(log);
  }
  process.stdout.write(JSON.stringify({ logs }));
} else {
  process.stderr.write(`unknown command ${command}\n`);
  process.exit(2);
}
