// Writes the OpenAPI document of the brood binary named by BROOD_BIN to openapi.json (the
// source of src/schema.ts). `npm run update-schema` builds first, runs this, then generates.
import { writeFile } from "node:fs/promises";

import { startServer } from "../dist/test/helpers/server.js";

const server = await startServer();
try {
  const doc = await server.client().openapi();
  const path = new URL("../openapi.json", import.meta.url);
  await writeFile(path, `${JSON.stringify(doc, null, 2)}\n`);
  console.log(`openapi.json: the document of ${process.env.BROOD_BIN}`);
} finally {
  await server.stop();
}
