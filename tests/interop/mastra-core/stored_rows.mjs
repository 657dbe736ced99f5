// Stored `mastra_messages` rows (JSON on stdin; dates as ISO strings) read as Mastra reads them:
// @mastra/mongodb 1.19's `parseRow`, then `new MessageList().add(rows, "memory").get.all.db()`, one row at
// a time. Prints, per row, `{ok: [messages]}` or `{error: "..."}` (Mastra reads no row of a page then).
// Usage: node stored_rows.mjs <package dir>   (the folder whose node_modules holds @mastra/core)
import { readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const [pkgdir = '.'] = process.argv.slice(2);
const requireFrom = createRequire(join(resolve(pkgdir), 'package.json'));
const { MessageList } = await import(pathToFileURL(requireFrom.resolve('@mastra/core/agent')).href);

function parseRow(row) {  // @mastra/mongodb 1.19 `MemoryStorageMongoDB.parseRow`
  let content = row.content;
  if (typeof content === 'string') {
    try { content = JSON.parse(content); } catch {}
  }
  const result = {
    id: row.id, content, role: row.role,
    createdAt: row.createdAt == null ? row.createdAt : new Date(row.createdAt),
    threadId: row.thread_id, resourceId: row.resourceId,
  };
  if (row.type && row.type !== 'v2') result.type = row.type;
  return result;
}

const rows = JSON.parse(readFileSync(0, 'utf8'));
const out = rows.map((row) => {
  try {
    return { ok: JSON.parse(JSON.stringify(new MessageList().add([parseRow(row)], 'memory').get.all.db())) };
  } catch (error) {
    return { error: String(error?.message ?? error).slice(0, 300) };
  }
});
process.stdout.write(JSON.stringify(out));
