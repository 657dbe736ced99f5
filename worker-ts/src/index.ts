export type {
  AgentResponse,
  EnrichedMessage,
  EnrichedRequest,
  HistoryInfo,
  ResponseMessage,
  Source,
} from './events.js';
export { enrichedProblem } from './events.js';
export {
  assistantText,
  buildResponse,
  DEFAULT_SEEN_PER_PARTITION,
  failedResponse,
  FAILED,
  replyProblem,
  SeenEvents,
  textReply,
  Turn,
  type Reply,
} from './turn.js';
export { isRetryLater, respond, RetryLater, TurnGivenUp, TurnTimeout, type Outcome, type RespondOptions } from './respond.js';
export { AgentWorker, type Handler, type Logger, type LogLevel, type WorkerOptions, type WorkerEvents, type WorkerStats } from './worker.js';
export { platformaticClient } from './platformatic.js';
export { kafkajsClient } from './kafkajs.js';
export { connectionFromEnv, type ConnectionOptions, type Env, type SaslOptions, type TlsOptions } from './settings.js';
export { CAPABILITIES, type Capability } from './capabilities.js';
export {
  mastraObserverHandler,
  extractedMetadata,
  extractedProblem,
  EXTRACTED_MAX_BYTES,
  EXTRACTED_MAX_DEPTH,
  THREAD_TITLE_MAX_CHARS,
  observeKey,
  observerHandler,
  ObserverWorker,
  workProblem,
  type MastraExtractorLike,
  type MastraObservationalMemoryLike,
  type MastraObserverOptions,
  type ObserverWorkerOptions,
  type Observation,
  type ObserveFn,
  type ObserveRequest,
  type ObserveResult,
  type ObserverHandler,
  type ReflectFn,
  type ReflectRequest,
  type ReflectResult,
} from './observer.js';
