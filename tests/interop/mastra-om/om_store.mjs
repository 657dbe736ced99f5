// Drives @mastra/mongodb 1.19's own Observational Memory methods against a database, for
// tests/interop/test_mastra_om_storage_interop.py.
//
//   MONGODB_URI=... node om_store.mjs <dbName> init
//       Mastra's init(): its collections and default indexes (mastra_observational_memory's included).
//   MONGODB_URI=... node om_store.mjs <dbName> read <threadId|-> <resourceId>
//       Prints {record, history}: getObservationalMemory and getObservationalMemoryHistory.
//   MONGODB_URI=... node om_store.mjs <dbName> write < {threadId, resourceId, scope, observations, tokenCount,
//                                                       lastObservedAt, observedMessageIds, reflection,
//                                                       reflectionTokens, observing}
//       The writes Mastra's OM makes: initializeObservationalMemory, updateActiveObservations, then (when
//       `reflection` is given) createReflectionGeneration, then (when `observing`) setObservingFlag(true).
//       Prints {record} (getObservationalMemory after them).
//   MONGODB_URI=... node om_store.mjs <dbName> thread-om <threadId>
//       Prints {om}: getThreadOMMetadata of the thread's metadata (getThreadById), where resource scope keeps
//       each thread's cursor (`lastObservedAt`) and hints.
//   MONGODB_URI=... node om_store.mjs <dbName> write-thread-om < {threadId, resourceId, om}
//       The thread saved if missing (saveThread), then its metadata set as resource scope's persist does:
//       updateThread with setThreadOMMetadata(metadata, om). Prints {om} read back.
//   MONGODB_URI=... node om_store.mjs <dbName> persist-thread-om < {threadId, scope, processed}
//       The thread's write of @mastra/memory 1.31's SyncObservationStrategy.persist (scope 'thread') or
//       ResourceScopedObservationStrategy.persist (scope 'resource': the thread's `lastObservedAt` too), line
//       for line (below): getThreadById, resolveThreadTitleUpdate, setThreadOMMetadata, patchThread.
//       `processed` is the Observer's parsed answer ({threadTitle, currentTask, suggestedContinuation,
//       extractedValues, lastObservedMessageCursor, lastObservedAt}); each key of `extractedValues` is a
//       custom extractor's slug (an `Extractor` of the package, default metadataKeyPath `extracted.<slug>`).
//       Prints {thread}.
import { getThreadOMMetadata, isThreadTitlePinned, setThreadOMMetadata } from '@mastra/core/memory';
import { Extractor } from '@mastra/memory';
import { MongoDBStore } from '@mastra/mongodb';

const [dbName, command, ...args] = process.argv.slice(2);
const uri = process.env.MONGODB_URI;
if (!uri || !dbName || !command) {
  console.error('usage: MONGODB_URI=... node om_store.mjs <dbName> init|read|write ...');
  process.exit(2);
}

async function readStdin() {
  const chunks = [];
  for await (const chunk of process.stdin) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString('utf8'));
}

// @mastra/memory 1.31 dist/src-*.js, not exported: resolveThreadTitleUpdate (observation-strategies/
// thread-title.ts) and buildThreadMetadataFromExtractedValues with its helpers (extracted-values.ts), as shipped
// (the path-safety check left out: the slugs here are the package's own).
function resolveThreadTitleUpdate(thread, generatedTitle) {
  const candidate = generatedTitle?.trim();
  if (!candidate || candidate.length < 3) return undefined;
  if (isThreadTitlePinned(thread?.metadata)) return undefined;
  if (candidate === thread?.title?.trim()) return undefined;
  return candidate;
}
const isPresentExtractedValue = (value) => value !== undefined && value !== null && value !== '';
function normalizeExtractedValues(values) {
  if (!values) return undefined;
  const normalized = Object.fromEntries(Object.entries(values).filter(([, value]) => isPresentExtractedValue(value)));
  return Object.keys(normalized).length > 0 ? normalized : undefined;
}
function setValueAtPath(metadata, keyPath, value) {
  if (!isPresentExtractedValue(value)) return;
  const segments = keyPath === false ? undefined : keyPath.split('.').filter(Boolean);
  if (!segments?.length) return;
  let current = metadata;
  for (const segment of segments.slice(0, -1)) {
    const next = current[segment];
    if (!next || typeof next !== 'object' || Array.isArray(next)) current[segment] = {};
    current = current[segment];
  }
  current[segments[segments.length - 1]] = value;
}
function buildThreadMetadataFromExtractedValues(extractors, values) {
  const metadata = {};
  const normalized = normalizeExtractedValues(values);
  if (!normalized) return metadata;
  for (const extractor of extractors) {
    if (!Object.prototype.hasOwnProperty.call(normalized, extractor.slug)) continue;
    setValueAtPath(metadata, extractor.metadataKeyPath, normalized[extractor.slug]);
  }
  return metadata;
}

const store = new MongoDBStore({ id: 'interop-om', uri, dbName, disableInit: command !== 'init' });
try {
  if (command === 'init') {
    await store.init();
    console.log(JSON.stringify({ ok: true }));
  } else {
    const memory = await store.getStore('memory');
    if (command === 'read') {
      const [threadArg, resourceId] = args;
      const threadId = threadArg === '-' ? null : threadArg;
      const record = await memory.getObservationalMemory(threadId, resourceId);
      const history = await memory.getObservationalMemoryHistory(threadId, resourceId, 10);
      console.log(JSON.stringify({ record, history }));
    } else if (command === 'write') {
      const input = await readStdin();
      const threadId = input.threadId ?? null;
      let record = await memory.initializeObservationalMemory({
        threadId, resourceId: input.resourceId, scope: input.scope ?? 'thread', config: { from: 'mastra' },
      });
      await memory.updateActiveObservations({
        id: record.id,
        observations: input.observations,
        tokenCount: input.tokenCount,
        lastObservedAt: new Date(input.lastObservedAt),
        observedMessageIds: input.observedMessageIds,
      });
      record = await memory.getObservationalMemory(threadId, input.resourceId);
      if (input.reflection !== undefined) {
        record = await memory.createReflectionGeneration({
          currentRecord: record, reflection: input.reflection, tokenCount: input.reflectionTokens,
        });
      }
      if (input.observing) await memory.setObservingFlag(record.id, true);
      console.log(JSON.stringify({ record: await memory.getObservationalMemory(threadId, input.resourceId) }));
    } else if (command === 'thread-om') {
      const thread = await memory.getThreadById({ threadId: args[0] });
      console.log(JSON.stringify({ om: getThreadOMMetadata(thread?.metadata) ?? null }));
    } else if (command === 'write-thread-om') {
      const input = await readStdin();
      let thread = await memory.getThreadById({ threadId: input.threadId });
      if (!thread) {
        const now = new Date();
        thread = await memory.saveThread({
          thread: { id: input.threadId, resourceId: input.resourceId, title: '', metadata: {}, createdAt: now, updatedAt: now },
        });
      }
      await memory.updateThread({ id: input.threadId, title: thread.title ?? '', metadata: setThreadOMMetadata(thread.metadata, input.om) });
      const read = await memory.getThreadById({ threadId: input.threadId });
      console.log(JSON.stringify({ om: getThreadOMMetadata(read?.metadata) ?? null }));
    } else if (command === 'persist-thread-om') {
      const { threadId, scope, processed } = await readStdin();
      const extractors = Object.keys(processed.extractedValues ?? {}).map(
        (slug) => new Extractor({ name: slug, instructions: `the ${slug}` }),
      );
      // SyncObservationStrategy.persist, the thread's part (ResourceScopedObservationStrategy.persist: the
      // same per thread, with the thread's cursor first)
      const thread = await memory.getThreadById({ threadId });
      if (thread) {
        const newTitle = resolveThreadTitleUpdate(thread, processed.threadTitle);
        const shouldUpdateThreadTitle = newTitle !== void 0;
        const previousOmMetadata = getThreadOMMetadata(thread.metadata);
        const metadataUpdate = buildThreadMetadataFromExtractedValues(extractors, processed.extractedValues);
        const newMetadata = setThreadOMMetadata(thread.metadata, {
          ...(scope === 'resource' ? { lastObservedAt: processed.lastObservedAt } : {}),
          suggestedResponse: metadataUpdate.suggestedResponse ?? processed.suggestedContinuation,
          currentTask: metadataUpdate.currentTask ?? processed.currentTask,
          threadTitle: metadataUpdate.threadTitle ?? processed.threadTitle,
          extracted: {
            ...previousOmMetadata?.extracted ?? {},
            ...metadataUpdate.extracted ?? {},
          },
          lastObservedMessageCursor: processed.lastObservedMessageCursor,
        });
        await memory.patchThread({
          id: threadId,
          ...shouldUpdateThreadTitle ? { title: newTitle } : {},
          metadata: newMetadata,
        });
      }
      console.log(JSON.stringify({ thread: await memory.getThreadById({ threadId }) }));
    } else {
      throw new Error(`unknown command ${command}`);
    }
  }
} finally {
  await store.close();
}
