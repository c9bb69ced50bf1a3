/**
 * The types cannot drift from the server: the committed `openapi.json` is the document the
 * real server serves, and `src/schema.ts` is what openapi-typescript generates from it.
 */

import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { readFile } from "node:fs/promises";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { after, before, test } from "node:test";

import { startServer, type TestServer } from "./helpers/server.js";

/** The package's folder (the tests run from `dist/test`). */
const PACKAGE = fileURLToPath(new URL("../../", import.meta.url));

const REGENERATE =
  "regenerate with `BROOD_BIN=<the brood binary> npm run update-schema` in clients/typescript " +
  "(it fetches the document from that binary into openapi.json and generates src/schema.ts), " +
  "then check src/types.ts against the change";

/** The JSON pointers where `a` and `b` differ, at most `most`. */
function differences(a: unknown, b: unknown, at = "", most = 20): string[] {
  if (typeof a !== "object" || typeof b !== "object" || a === null || b === null || Array.isArray(a) !== Array.isArray(b)) {
    return JSON.stringify(a) === JSON.stringify(b) ? [] : [at || "/"];
  }
  const keys = new Set([...Object.keys(a), ...Object.keys(b)]);
  const found: string[] = [];
  for (const key of keys) {
    const pointer = `${at}/${key.replaceAll("~", "~0").replaceAll("/", "~1")}`;
    const left = (a as Record<string, unknown>)[key];
    const right = (b as Record<string, unknown>)[key];
    found.push(...differences(left, right, pointer, most - found.length));
    if (found.length >= most) {
      break;
    }
  }
  return found;
}

let server: TestServer;
before(async () => {
  server = await startServer();
});
after(() => server.stop());

test("openapi.json is the document the server serves", async () => {
  const live = await server.client().openapi();
  const committed: unknown = JSON.parse(await readFile(`${PACKAGE}openapi.json`, "utf8"));
  const differ = differences(live, committed);
  assert.deepEqual(
    differ,
    [],
    `the server's OpenAPI document is not clients/typescript/openapi.json; they differ at ${differ.join(", ")}: ${REGENERATE}`,
  );
});

test("src/schema.ts is what openapi.json generates", async () => {
  const cli = `${PACKAGE}node_modules/openapi-typescript/bin/cli.js`;
  const check = promisify(execFile)(process.execPath, [cli, "openapi.json", "--output", "src/schema.ts", "--check"], {
    cwd: PACKAGE,
  });
  await assert.doesNotReject(check, `src/schema.ts is not what openapi.json generates: run \`npm run generate\`, or ${REGENERATE}`);
});
