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
/** The abortSignal each call was given (the AI SDK passes the one given to Mastra's generate). */
export const signals: (AbortSignal | undefined)[] = [];

function answer(prompt: PromptMessage[]): string {
  prompts.push(prompt);
  const last = prompt.at(-1);
  if (last && text(last).includes('FAIL')) throw new Error('the model failed (asked to by the test)');
  return stubAnswer(prompt);
}

/** Records the call's abortSignal; a last message saying SLOW makes a long call that stops when the signal is
 * aborted, as a provider's fetch does. */
async function slowIfAsked(options: { prompt: PromptMessage[]; abortSignal?: AbortSignal }): Promise<void> {
  signals.push(options.abortSignal);
  const last = options.prompt.at(-1);
  if (!last || !text(last).includes('SLOW')) return;
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(resolve, 60_000);
    options.abortSignal?.addEventListener('abort', () => {
      clearTimeout(timer);
      reject(options.abortSignal?.reason ?? new Error('aborted'));
    });
  });
}

const usage = { inputTokens: 0, outputTokens: 0, totalTokens: 0 };

export const stubModel = {
  specificationVersion: 'v2' as const,
  provider: 'stub',
  modelId: 'stub-from-memory',
  supportedUrls: {},
  async doGenerate(options: { prompt: PromptMessage[]; abortSignal?: AbortSignal }) {
    await slowIfAsked(options);
    return {
      content: [{ type: 'text' as const, text: answer(options.prompt) }],
      finishReason: 'stop' as const,
      usage,
      warnings: [],
    };
  },
  async doStream(options: { prompt: PromptMessage[]; abortSignal?: AbortSignal }) {
    await slowIfAsked(options);
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
