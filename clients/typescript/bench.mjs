// Throughput through the client: delegates CHILDREN `sim` children of 0 ms (in calls as large
// as the server's `max_tasks_per_call` allows), collects them with boundary + ack until every
// result was delivered, and prints children per second.
//
//   npm run build && BROOD_BIN=<brood binary> node bench.mjs [children]   # starts a server
//   npm run build && BROOD_URL=http://127.0.0.1:7070 node bench.mjs       # a running one
import { setTimeout as sleep } from "node:timers/promises";

import { Client, sim } from "./dist/src/index.js";
import { startServer } from "./dist/test/helpers/server.js";

const children = Number(process.argv[2] ?? 1000);
const server = process.env.BROOD_URL ? undefined : await startServer();
const brood = server ? server.client() : new Client(process.env.BROOD_URL, { apiKey: process.env.BROOD_API_KEY });

try {
  const { components } = await brood.openapi();
  const perCall = components.schemas.DelegateBody.properties.tasks.maxItems;
  const capacity = components.schemas.PutSession.properties.max_concurrent_children.maximum;
  const session = `bench-${Date.now()}`;
  await brood.putSession(session, { addressable: true, max_concurrent_children: capacity });

  const started = performance.now();
  let calls = 0;
  for (let sent = 0; sent < children; sent += perCall) {
    const size = Math.min(perCall, children - sent);
    const tasks = Array.from({ length: size }, (_, i) => ({ goal: `child ${sent + i}`, runner: sim({ ms: 0 }) }));
    await brood.delegate(session, tasks);
    calls += 1;
  }
  let delivered = 0;
  let envelopes = 0;
  while (delivered < children) {
    const envelope = await brood.boundary(session, "bench");
    if (envelope === null) {
      await sleep(2);
      continue;
    }
    delivered += (await brood.ack(envelope.claim_id)).delivered;
    envelopes += 1;
  }
  const seconds = (performance.now() - started) / 1000;
  console.log(
    `${children} children in ${calls} call(s) of at most ${perCall}, delivered in ${envelopes} envelope(s): ` +
      `${seconds.toFixed(2)} s, ${Math.round(children / seconds)} children/s ` +
      `(server: ${process.env.BROOD_URL ?? process.env.BROOD_BIN}, session capacity ${capacity})`,
  );
} finally {
  await server?.stop();
}
