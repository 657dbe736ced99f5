// A span per turn, continuing the request's `traceparent` (as the Python SDK's "agent turn" span): the
// handler runs inside it (a model call traced by the application nests under it), and the response carries
// the turn span's context in place of the request's. `@opentelemetry/api` is an optional peer: without it
// installed, or without a tracer provider registered by the application, there is no span and the headers
// pass on unchanged.
import type * as Otel from '@opentelemetry/api';

export type Headers = Record<string, Buffer | string | (Buffer | string)[] | undefined>;

const TRACE_HEADERS = new Set(['traceparent', 'tracestate', 'baggage']);

/** One turn's span: `run` the handler inside it, `headers` for the response, `end` it (with why it failed). */
export interface TurnSpan {
  run<T>(fn: () => Promise<T>): Promise<T>;
  headers(headers: Headers | undefined): Headers | undefined;
  end(failure?: string): void;
}

const noSpan: TurnSpan = {
  run: (fn) => fn(),
  headers: (headers) => headers,
  end: () => undefined,
};

export type Tracing = (headers: Headers | undefined, attributes: Record<string, string | number>) => TurnSpan;

/** No tracing: every turn gets the no-op span. */
export const tracingOff: Tracing = () => noSpan;

const text = (value: Buffer | string | (Buffer | string)[] | undefined): string | undefined => {
  const first = Array.isArray(value) ? value[0] : value;
  return first === undefined ? undefined : first.toString();
};

/** Tracing through `api` (the @opentelemetry/api module). */
export function tracingWith(api: typeof Otel): Tracing {
  const tracer = api.trace.getTracer('@message-history/worker');
  return (headers, attributes) => {
    const carrier: Record<string, string> = {};
    for (const [key, value] of Object.entries(headers ?? {})) {
      const found = text(value);
      if (found !== undefined) carrier[key.toLowerCase()] = found;
    }
    const parent = api.propagation.extract(api.ROOT_CONTEXT, carrier);
    const span = tracer.startSpan(
      'agent turn',
      { kind: api.SpanKind.CONSUMER, attributes: { 'messaging.system': 'kafka', 'messaging.operation.type': 'process', ...attributes } },
      parent,
    );
    const context = api.trace.setSpan(parent, span);
    return {
      run: (fn) => api.context.with(context, fn),
      headers(original) {
        const injected: Record<string, string> = {};
        api.propagation.inject(context, injected);
        if (Object.keys(injected).length === 0) return original;
        const replaced = new Set([...TRACE_HEADERS, ...Object.keys(injected).map((k) => k.toLowerCase())]);
        const kept = Object.fromEntries(Object.entries(original ?? {}).filter(([k]) => !replaced.has(k.toLowerCase())));
        return { ...kept, ...injected };
      },
      end(failure) {
        if (failure !== undefined) span.setStatus({ code: api.SpanStatusCode.ERROR, message: failure });
        span.end();
      },
    };
  };
}

/** Tracing if `@opentelemetry/api` can be loaded, else off. */
export async function loadTracing(): Promise<Tracing> {
  try {
    return tracingWith((await import('@opentelemetry/api')) as typeof Otel);
  } catch {
    return tracingOff;
  }
}
