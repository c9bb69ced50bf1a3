/**
 * Waiting in the tests: for a condition, or for envelopes.
 */

import { setTimeout as sleep } from "node:timers/promises";

import type { Client, Envelope } from "../../src/index.js";

/** Resolves with `probe()`'s first answer that is not `undefined`/`null`/`false`; throws after `withinMs`. */
export async function eventually<T>(
  what: string,
  probe: () => Promise<T | undefined | null | false>,
  withinMs = 10_000,
): Promise<T> {
  const deadline = Date.now() + withinMs;
  for (;;) {
    const got = await probe();
    if (got !== undefined && got !== null && got !== false) {
      return got;
    }
    if (Date.now() > deadline) {
      throw new Error(`${what}: not within ${withinMs} ms`);
    }
    await sleep(25);
  }
}

/** The next envelope of `sessionId`, waiting for one to be ready. */
export function nextEnvelope(client: Client, sessionId: string, consumer = "test"): Promise<Envelope> {
  return eventually(`an envelope of ${sessionId}`, () => client.boundary(sessionId, consumer));
}
