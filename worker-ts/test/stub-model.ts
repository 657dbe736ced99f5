// A language model that answers without a network (the AI SDK's LanguageModelV2, what a Mastra 1.x Agent
// calls): it says how many earlier messages it was given and repeats the last one, so a test can check the
// Agent got the whole context. It throws when the last message asks it to (a failed turn).

type PromptPart = { type: string; text?: string };
type PromptMessage = { role: string; content: string | PromptPart[] };

function text(message: PromptMessage): string {
  if (typeof message.content === 'string') return message.content;
  return message.content.map((part) => part.text ?? '').join(' ').trim();
}

export function stubAnswer(prompt: PromptMessage[]): string {
  const dialogue = prompt.filter((m) => m.role !== 'system');
  const last = dialogue.at(-1);
  return `I remember ${dialogue.length - 1} earlier messages. You said: ${last ? text(last) : '(nothing)'}`;
}

export const prompts: PromptMessage[][] = [];

function answer(prompt: PromptMessage[]): string {
  prompts.push(prompt);
  const last = prompt.at(-1);
  if (last && text(last).includes('FAIL')) throw new Error('the model failed (asked to by the test)');
  return stubAnswer(prompt);
}

const usage = { inputTokens: 0, outputTokens: 0, totalTokens: 0 };

export const stubModel = {
  specificationVersion: 'v2' as const,
  provider: 'stub',
  modelId: 'stub-from-memory',
  supportedUrls: {},
  async doGenerate(options: { prompt: PromptMessage[] }) {
    return {
      content: [{ type: 'text' as const, text: answer(options.prompt) }],
      finishReason: 'stop' as const,
      usage,
      warnings: [],
    };
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
