// Copy the README's TypeScript snippet, as written, to readme-example/example.ts (git-ignored),
// so that `npm test`'s one tsc run type-checks and compiles it with the package and
// test/readme.test.ts runs it against a live `engram up`.

import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const PACKAGE = dirname(dirname(fileURLToPath(import.meta.url)));
const README = join(PACKAGE, "..", "..", "README.md");
const EXAMPLE = join(PACKAGE, "readme-example", "example.ts");

/** The README's one TypeScript block that mentions `containing`. */
function typescriptBlock(containing) {
  const blocks = [...readFileSync(README, "utf8").matchAll(/```typescript\n(.*?)```/gs)]
    .map((match) => match[1])
    .filter((block) => block.includes(containing));
  if (blocks.length !== 1) throw new Error(`README.md has ${blocks.length} typescript blocks with ${containing}, not 1`);
  return blocks[0];
}

mkdirSync(dirname(EXAMPLE), { recursive: true });
writeFileSync(EXAMPLE, typescriptBlock("publishOne"));
