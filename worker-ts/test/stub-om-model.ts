// A language model for Mastra's Observer and Reflector agents without a network (the AI SDK's
// LanguageModelV2): it answers in the shape each agent's parser reads, records every prompt, and fails when the
// messages it is shown ask it to.

type PromptPart = { type: string; text?: string };
export type PromptMessage = { role: string; content: string | PromptPart[] };

export function promptText(message: PromptMessage): string {
  if (typeof message.content === 'string') return message.content;
  return message.content.map((part) => part.text ?? '').join(' ');
}

export const omPrompts: PromptMessage[][] = [];

function answer(prompt: PromptMessage[]): string {
  omPrompts.push(prompt);
  const system = prompt.filter((m) => m.role === 'system').map(promptText).join('\n');
  const shown = prompt.filter((m) => m.role !== 'system').map(promptText).join('\n');
  if (shown.includes('FAIL')) throw new Error('the observer model failed (asked to by the test)');
  if (system.includes('observation reflections')) {
    return '<observations>\n* 🔴 (10:00) User plans a spring train trip, cheap days wanted\n</observations>';
  }
  return [
    '<observations>',
    '* 🔴 (10:00) User asked about trains from Lyon to Turin',
    '</observations>',
    '<current-task>',
    'find the cheapest spring day',
    '</current-task>',
    '<suggested-response>',
    'Ask which week suits them',
    '</suggested-response>',
    '<thread-title>Cheap spring trains</thread-title>',
    // a custom extractor's section, when the Observer's prompt asks for one (`observation.extract`)
    ...(system.includes('<mood>') ? ['<mood>', 'calm', '</mood>'] : []),
  ].join('\n');
}

const usage = { inputTokens: 0, outputTokens: 0, totalTokens: 0 };

export const stubObserverModel = {
  specificationVersion: 'v2' as const,
  provider: 'stub',
  modelId: 'stub-observer',
  supportedUrls: {},
  async doGenerate(options: { prompt: PromptMessage[] }) {
    return { content: [{ type: 'text' as const, text: answer(options.prompt) }], finishReason: 'stop' as const, usage, warnings: [] };
  },
  async doStream(options: { prompt: PromptMessage[] }) {
    const said = answer(options.prompt);
    const stream = new ReadableStream({
      start(controller) {
        controller.enqueue({ type: 'stream-start', warnings: [] });
        controller.enqueue({ type: 'text-start', id: 'text-1' });
        controller.enqueue({ type: 'text-delta', id: 'text-1', delta: said });
        controller.enqueue({ type: 'text-end', id: 'text-1' });
        controller.enqueue({ type: 'finish', finishReason: 'stop', usage });
        controller.close();
      },
    });
    return { stream };
  },
};
