// A language model that answers without a network: the example's stand-in for a real provider's model
// (`openai('gpt-4o')`, `anthropic('claude-...')`, ...). It implements the AI SDK's LanguageModelV2 interface,
// the one a Mastra 1.x `Agent` calls, and answers from what the agent put in the prompt: how many earlier
// messages of the conversation it was given, and what the user just said.

type PromptPart = { type: string; text?: string };
type PromptMessage = { role: string; content: string | PromptPart[] };

function text(message: PromptMessage): string {
  if (typeof message.content === 'string') return message.content;
  return message.content.map((part) => part.text ?? '').join(' ').trim();
}

/** What the stub says for a prompt: deterministic, so the test can check it was given the history. */
export function stubAnswer(prompt: PromptMessage[]): string {
  const dialogue = prompt.filter((m) => m.role !== 'system');
  const last = dialogue.at(-1);
  const earlier = dialogue.length - 1;
  return `I remember ${earlier} earlier messages. You said: ${last ? text(last) : '(nothing)'}`;
}

export const prompts: PromptMessage[][] = [];

export const stubModel = {
  specificationVersion: 'v2' as const,
  provider: 'stub',
  modelId: 'stub-from-memory',
  supportedUrls: {},
  async doGenerate(options: { prompt: PromptMessage[] }) {
    prompts.push(options.prompt);
    return {
      content: [{ type: 'text' as const, text: stubAnswer(options.prompt) }],
      finishReason: 'stop' as const,
      usage: { inputTokens: 0, outputTokens: 0, totalTokens: 0 },
      warnings: [],
    };
  },
  async doStream(options: { prompt: PromptMessage[] }) {
    prompts.push(options.prompt);
    const answer = stubAnswer(options.prompt);
    const stream = new ReadableStream({
      start(controller) {
        controller.enqueue({ type: 'stream-start', warnings: [] });
        controller.enqueue({ type: 'text-start', id: 'text-1' });
        controller.enqueue({ type: 'text-delta', id: 'text-1', delta: answer });
        controller.enqueue({ type: 'text-end', id: 'text-1' });
        controller.enqueue({
          type: 'finish',
          finishReason: 'stop',
          usage: { inputTokens: 0, outputTokens: 0, totalTokens: 0 },
        });
        controller.close();
      },
    });
    return { stream };
  },
};
