// The README's TypeScript snippet, as written (`npm test` copies it to readme-example/ and its
// tsc run type-checks and compiles it), run against the live `engram up` over both transports
// (STYLE habit 13: examples are tests).

import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, test } from "node:test";

import { publishOne } from "../readme-example/example.js";
import { connectionFile, TRANSPORTS } from "./support.js";

describe("the README's TypeScript snippet", () => {
  test("is what npm test compiled (the README has not changed since)", () => {
    // dist/test/ -> the package's readme-example/ and the repository's README.
    const copy = readFileSync(new URL("../../readme-example/example.ts", import.meta.url), "utf8");
    const readme = readFileSync(new URL("../../../../README.md", import.meta.url), "utf8");
    assert.ok(readme.includes("```typescript\n" + copy + "```"), "run `npm test`, which copies the snippet");
  });

  for (const transport of TRANSPORTS) {
    test(`publishes a session, saves with wait and recalls over ${transport}`, async () => {
      const { accepted, saved, context } = await publishOne(connectionFile(), transport);
      assert.deepEqual([accepted.status, accepted.duplicate], [202, false]);
      // A second run saves the same text again: then it reinforces the entry instead.
      assert.equal(saved.status, 200);
      const counts = "saved" in saved ? saved.saved + saved.reinforced : 0;
      assert.equal(counts, 1, JSON.stringify(saved));
      assert.match(context, /Alice prefers store credit to card refunds\./);
    });
  }
});
