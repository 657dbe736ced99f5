// An AgentResponse checked against the contract's schema before it is sent, as the Python SDK's
// AgentResponse.model_validate does: a reply the service would dead-letter (a misspelled role, content
// without `parts`, a part without its type) becomes a failed turn with the reason instead.
import { Ajv2020 } from 'ajv/dist/2020.js';

import type { AgentResponse } from './events.js';
import { agentResponseSchema } from './generated/schemas.js';

// Formats (date-time) are not checked: the worker writes createdAt itself; strict off for the schema's
// annotations (`title`, `default` beside `$ref`).
const ajv = new Ajv2020({ allErrors: false, strict: false, validateFormats: false });
const check = ajv.compile(agentResponseSchema as object);

/** Why `response` does not fit the AgentResponse schema, or undefined. */
export function responseProblem(response: AgentResponse): string | undefined {
  if (check(response)) return undefined;
  const error = check.errors?.[0];
  return error ? `${error.instancePath || '/'} ${error.message ?? 'is invalid'}` : 'does not fit the schema';
}
