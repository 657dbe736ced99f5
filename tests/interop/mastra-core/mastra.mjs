// Mastra's own MessageList, driven from the Python interop test (tests/interop/test_mastra_core_interop.py).
//
//   node mastra.mjs build  <pkgdir>   prints {version, messages}: conversations built by MessageList, as
//                                     MastraDBMessage JSON (what Mastra stores and what workers send)
//   node mastra.mjs accept <pkgdir>   reads an EnrichedRequest on stdin, adds its messages to a fresh
//                                     MessageList with their `source` ('memory' | 'input'), prints what
//                                     Mastra then holds: all / remembered / input ids, in order
//
// <pkgdir> is the folder whose node_modules holds the @mastra/core under test (this folder pins 0.24.9,
// v1/ pins 1.71.0), so one script serves every pinned version.
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const [command, pkgdir = '.'] = process.argv.slice(2);
const requireFrom = createRequire(join(resolve(pkgdir), 'package.json'));
const version = JSON.parse(readFileSync(requireFrom.resolve('@mastra/core/package.json'), 'utf8')).version;
const { MessageList } = await import(pathToFileURL(requireFrom.resolve('@mastra/core/agent')).href);

// 1.x calls the stored shape `db` (MastraDBMessage); 0.x calls the same shape `v2` (MastraMessageV2).
const stored = (view) => (view.db ?? view.v2)();

function build() {
  const threadId = 'interop-thread';
  const resourceId = 'interop-user';
  const list = new MessageList({ threadId, resourceId });
  // Turn 1: plain user text; the assistant reasons, calls a tool, gets its result, answers with text and a file.
  list.add({ role: 'user', content: 'What is 1+2? Also send me a file.' }, 'input');
  list.add(
    [
      {
        role: 'assistant',
        content: [
          { type: 'reasoning', text: 'Add the numbers with the tool.', providerOptions: { anthropic: { signature: 'sig-1' } } },
          { type: 'tool-call', toolCallId: 'call-1', toolName: 'calculator', args: { a: 1, b: 2 } },
        ],
      },
      { role: 'tool', content: [{ type: 'tool-result', toolCallId: 'call-1', toolName: 'calculator', result: { sum: 3 } }] },
      {
        role: 'assistant',
        content: [
          { type: 'text', text: 'The answer is 3. Here is the file.' },
          { type: 'file', data: 'aGVsbG8gd29ybGQ=', mimeType: 'text/plain' },
        ],
      },
    ],
    'response',
  );
  // Turn 2: the user sends text with a file; the assistant cites a source and starts a tool call that has no
  // result yet (state 'call'), as a client-side tool leaves it.
  list.add(
    {
      role: 'user',
      content: [
        { type: 'text', text: 'Summarise this page for me.' },
        { type: 'file', data: 'https://example.com/page.pdf', mimeType: 'application/pdf' },
      ],
    },
    'input',
  );
  list.add(
    {
      id: 'ui-assistant-2',
      role: 'assistant',
      content: 'Looking it up.',
      parts: [
        { type: 'text', text: 'Looking it up.' },
        { type: 'source', source: { sourceType: 'url', id: 'src-1', url: 'https://example.com/page.pdf', title: 'The page' } },
        { type: 'tool-invocation', toolInvocation: { state: 'call', toolCallId: 'call-2', toolName: 'askUser', args: { question: 'Which part?' } } },
      ],
      metadata: { custom: 'kept' },
    },
    'response',
  );
  return { version, messages: stored(list.get.all) };
}

function accept(event) {
  const list = new MessageList({ threadId: event.threadId, resourceId: event.resourceId });
  for (const message of event.messages) list.add(message, message.source);
  const ids = (messages) => messages.map((m) => m.id);
  return {
    version,
    all: ids(stored(list.get.all)),
    remembered: ids(stored(list.get.remembered)),
    input: ids(stored(list.get.input)),
    messages: stored(list.get.all),
  };
}

let result;
if (command === 'build') result = build();
else if (command === 'accept') result = accept(JSON.parse(readFileSync(0, 'utf8')));
else {
  console.error('usage: node mastra.mjs build|accept [pkgdir]');
  process.exit(2);
}
process.stdout.write(JSON.stringify(result) + '\n');
