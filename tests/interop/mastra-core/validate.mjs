// Validate JSON documents against one of the published JSON Schemas (schemas/generated/*.schema.json) with
// ajv, a JSON Schema implementation nobody here wrote.
//
//   node validate.mjs <schema.json>   reads a JSON array of documents on stdin, prints one result per document:
//                                     {"valid": true} or {"valid": false, "errors": [...]}
import { readFileSync } from 'node:fs';
import Ajv2020 from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';

const [schemaFile] = process.argv.slice(2);
const ajv = new Ajv2020({ allErrors: true, strict: false });
addFormats(ajv);
const validate = ajv.compile(JSON.parse(readFileSync(schemaFile, 'utf8')));
const results = JSON.parse(readFileSync(0, 'utf8')).map((doc) =>
  validate(doc) ? { valid: true } : { valid: false, errors: validate.errors },
);
process.stdout.write(JSON.stringify(results) + '\n');
