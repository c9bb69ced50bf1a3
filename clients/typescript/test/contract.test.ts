/**
 * The fields the server is gaining (task `input` and `retry`, worker `output`, results'
 * `output` and `attempts`, idempotent delegates, bounded envelopes, `/readyz`): a server
 * without one refuses it (400 on the unknown field, 404 on the path), and its test fails.
 */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { BroodError, Client, external, sim, Worker, type Item, type Json, type WorkItem } from "../src/index.js";
import { startServer, type TestServer } from "./helpers/server.js";
import { eventually, nextEnvelope } from "./helpers/wait.js";

/** Runs `action`, which must throw a BroodError; answers it. */
async function refusal(action: () => Promise<unknown>): Promise<BroodError> {
  try {
    await action();
  } catch (e) {
    assert.ok(e instanceof BroodError, `a BroodError, not ${e}`);
    return e;
  }
  assert.fail("the request succeeded");
}

/** The only result of `sessionId`, acked. */
async function theResult(brood: Client, sessionId: string): Promise<Item> {
  const envelope = await nextEnvelope(brood, sessionId);
  await brood.ack(envelope.claim_id);
  assert.equal(envelope.items.length, 1, JSON.stringify(envelope.items));
  return envelope.items[0]!;
}

/** Runs one external child of `queue` with `handler`; answers the item it got and the errors reported. */
async function runOne(
  brood: Client,
  queue: string,
  handler: (item: WorkItem) => unknown,
): Promise<{ item: WorkItem; errors: unknown[] }> {
  let got: WorkItem | undefined;
  const errors: unknown[] = [];
  const worker = new Worker(brood, {
    worker: "contract",
    queue,
    waitMs: 1000,
    handler: (item) => {
      got = item;
      return handler(item) as Json;
    },
    onError: (e) => errors.push(e),
  });
  assert.equal(await worker.run({ maxItems: 1 }), 1);
  assert.ok(got);
  return { item: got, errors };
}

describe("the server's additions", () => {
  let server: TestServer;
  let brood: Client;
  before(async () => {
    server = await startServer();
    brood = server.client();
  });
  after(() => server.stop());

  test("a worker gets the task's input and context; results carry its output and attempts", async () => {
    await brood.putSession("data", { addressable: true });
    const started = Date.now();
    const call = await brood.delegate("data", [
      { goal: "add one", runner: external("data-q"), input: { n: 41, tags: ["a"] }, timeout_ms: 60_000 },
    ]);
    const { item, errors } = await runOne(brood, "data-q", (it) => ({
      summary: "added",
      output: { n: (it.input as { n: number }).n + 1 },
    }));
    assert.deepEqual(errors, []);
    assert.deepEqual(item.input, { n: 41, tags: ["a"] });
    assert.equal(item.session_id, "data");
    assert.equal(item.call_id, call.call_id);
    assert.equal(item.attempt, 1);
    assert.ok(typeof item.deadline_at === "number" && item.deadline_at >= started + 60_000, String(item.deadline_at));

    const result = await theResult(brood, "data");
    assert.deepEqual([result.summary, result.output, result.attempts], ["added", { n: 42 }, 1]);
    const child = (await brood.getCall(call.call_id)).children[0];
    assert.deepEqual([child?.output, child?.attempts], [{ n: 42 }, 1]);
  });

  test("bare output from a handler, and no input or deadline", async () => {
    await brood.putSession("bare", { addressable: true });
    await brood.delegate("bare", [{ goal: "list", runner: external("bare-q") }]);
    const { item, errors } = await runOne(brood, "bare-q", () => [1, 2, 3]);
    assert.deepEqual(errors, []);
    assert.equal(item.input, null);
    assert.equal(item.deadline_at, null);
    const result = await theResult(brood, "bare");
    assert.deepEqual(result.output, [1, 2, 3]);
    // A success completed without a summary has an empty one.
    assert.equal(result.summary ?? "", "");
  });

  test("a retry policy runs a failing child again; results say the attempts", async () => {
    await brood.putSession("retries", { addressable: true });
    await brood.delegate("retries", [
      { goal: "fails", runner: sim({ outcome: "fail" }), retry: { max_attempts: 3, backoff_ms: 10, max_backoff_ms: 50 } },
    ]);
    const result = await theResult(brood, "retries");
    assert.deepEqual([result.status, result.attempts], ["failed", 3]);
  });

  test("an idempotent delegate answers the first call again; another body with its key is 409", async () => {
    await brood.putSession("idem", { addressable: true });
    const tasks = [{ goal: "once", runner: sim({ ms: 10 }) }];
    const first = await brood.delegate("idem", tasks, { idempotencyKey: "order-17" });
    const again = await brood.delegate("idem", tasks, { idempotencyKey: "order-17" });
    assert.equal(again.call_id, first.call_id);
    assert.deepEqual(again, first);
    const conflict = await refusal(() =>
      brood.delegate("idem", [{ goal: "other", runner: sim() }], { idempotencyKey: "order-17" }),
    );
    assert.deepEqual([conflict.status, conflict.code], [409, "idempotency_conflict"]);
    const state = await brood.getSession("idem");
    assert.equal(state.calls.length, 1, "one call was made");
  });

  test("max_items and max_bytes bound an envelope; `more` says what was left", async () => {
    await brood.putSession("bounded", { addressable: true });
    const tasks = [1, 2, 3, 4, 5].map((n) => ({ goal: `item ${n}`, runner: sim({ summary: `result ${n}` }) }));
    await brood.delegate("bounded", tasks, { independentCompletions: true });
    await eventually("five ready", async () => (await brood.getSession("bounded")).counts.ready === 5);

    const two = await brood.boundary("bounded", "test", { maxItems: 2 });
    assert.ok(two);
    assert.deepEqual([two.items.length, two.more], [2, true]);
    await brood.ack(two.claim_id);
    const one = await brood.boundary("bounded", "test", { maxBytes: 1 });
    assert.ok(one);
    assert.deepEqual([one.items.length, one.more], [1, true], "at least one item is handed out");
    await brood.ack(one.claim_id);
    const rest = await brood.boundary("bounded", "test", { maxItems: 10 });
    assert.ok(rest);
    assert.deepEqual([rest.items.length, rest.more], [2, false]);
    await brood.ack(rest.claim_id);
  });

  test("/readyz answers 200 while the server admits work", async () => {
    const ready = await brood.readyz();
    assert.equal(typeof ready, "object");
  });
});

describe("a server bounding outputs", () => {
  let server: TestServer;
  let brood: Client;
  before(async () => {
    server = await startServer({ args: ["--max-output-bytes", "256"] });
    brood = server.client();
  });
  after(() => server.stop());

  test("output over the bound fails the child with the server's reason", async () => {
    await brood.putSession("big", { addressable: true });
    await brood.delegate("big", [{ goal: "too much", runner: external("big-q") }]);
    const { errors } = await runOne(brood, "big-q", () => ({ output: "x".repeat(1000) }));
    assert.ok(errors.some((e) => e instanceof BroodError && e.status === 400), String(errors));
    const result = await theResult(brood, "big");
    assert.equal(result.status, "failed");
    assert.match(result.error ?? "", /refused the child's output/);
  });
});
