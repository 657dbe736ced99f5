// dist/cjs holds the CommonJS build: a package.json saying so makes Node (and TypeScript) read its .js and
// .d.ts files as CommonJS although the package itself is `"type": "module"`.
import { writeFileSync } from 'node:fs';

writeFileSync(new URL('../dist/cjs/package.json', import.meta.url), '{ "type": "commonjs" }\n');
