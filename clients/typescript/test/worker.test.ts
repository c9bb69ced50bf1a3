/**
 * The worker kit against the real server: it completes external children, heartbeats a slow
 * handler past a short lease, stops cleanly, fails a child whose handler throws, gives up a
 * child it lost, and sends again a completion whose answer was lost.
 */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { BroodError, Client, external, Worker, type Item, type WorkItem } from "../src/index.js";
import { startServer, type TestServer } from "./helpers/server.js";
import { eventually, nextEnvelope } from "./helpers/wait.js";

/** Every result of `sessionId` until `count` arrived, acked. */
async function results(brood: Client, sessionId: string, count: number): Promise<Item[]> {
  const items: Item[] = [];
  while (items.length < count) {
    const envelope = await nextEnvelope(brood, sessionId);
    items.push(...envelope.items.filter((i) => i.kind === "result"));
    await brood.ack(envelope.claim_id);
  }
  return items.sort((a, b) => a.task_index - b.task_index);
}

/** A `fetch` that counts the requests whose path ends with each name. */
function countingFetch(counts: Map<string, number>): typeof fetch {
  return (input, init) => {
    const last = new URL(String(input)).pathname.split("/").pop() ?? "";
    counts.set(last, (counts.get(last) ?? 0) + 1);
    return fetch(input, init);
  };
}

describe("the worker kit", () => {
  let server: TestServer;
  let brood: Client;
  /** The least lease a poll may ask for, as the document states it. */
  let minLeaseMs: number;
  before(async () => {
    server = await startServer();
    brood = server.client();
    const doc = (await brood.openapi()) as {
      components: { schemas: { PollBody: { properties: { lease_ms: { minimum: number } } } } };
    };
    minLeaseMs = doc.components.schemas.PollBody.properties.lease_ms.minimum;
    assert.ok(minLeaseMs > 0);
  });
  after(() => server.stop());

  /** A session with `goals` delegated as external children on `queue`. */
  async function delegateExternal(sessionId: string, queue: string, goals: string[]): Promise<string> {
    await brood.putSession(sessionId, { addressable: true });
    const call = await brood.delegate(
      sessionId,
      goals.map((goal) => ({ goal, runner: external(queue) })),
      { independentCompletions: true },
    );
    return call.call_id;
  }

  test("completes external children with the handler's summary", async () => {
    await delegateExternal("kit", "kit-q", ["a", "b", "c"]);
    const errors: unknown[] = [];
    const worker = new Worker(brood, {
      worker: "w1",
      queue: "kit-q",
      waitMs: 1000,
      handler: (item) => ({ summary: `did ${item.goal}` }),
      onError: (e) => errors.push(e),
    });
    assert.equal(await worker.run({ maxItems: 3 }), 3);
    assert.equal(worker.running, false);
    const done = await results(brood, "kit", 3);
    assert.deepEqual(
      done.map((i) => [i.status, i.summary]),
      [
        ["succeeded", "did a"],
        ["succeeded", "did b"],
        ["succeeded", "did c"],
      ],
    );
    assert.deepEqual(errors, []);
  });

  test("heartbeats a handler that outlasts its lease", async () => {
    await delegateExternal("slow", "slow-q", ["slow"]);
    const counts = new Map<string, number>();
    const client = server.client({ fetch: countingFetch(counts) });
    const errors: unknown[] = [];
    let runs = 0;
    const worker = new Worker(client, {
      worker: "slowpoke",
      queue: "slow-q",
      leaseMs: minLeaseMs,
      waitMs: 1000,
      handler: async (item, context) => {
        runs += 1;
        assert.equal(item.lease_ms, minLeaseMs);
        context.progress("working");
        await sleep(3 * minLeaseMs);
        assert.equal(context.signal.aborted, false);
        return { summary: "outlived its lease" };
      },
      onError: (e) => errors.push(e),
    });
    assert.equal(await worker.run({ maxItems: 1 }), 1);
    assert.deepEqual(errors, [], "the lease never ran out, so the completion was taken");
    assert.equal(runs, 1);
    assert.ok((counts.get("heartbeat") ?? 0) >= 3, `heartbeats: ${counts.get("heartbeat")}`);
    const [result] = await results(brood, "slow", 1);
    assert.deepEqual([result?.status, result?.summary], ["succeeded", "outlived its lease"]);
  });

  test("stop() waits for the child under way, and ends an idle poll at once", async () => {
    const callId = await delegateExternal("stopping", "stop-q", ["long"]);
    let started = false;
    let finished = false;
    const worker = new Worker(brood, {
      worker: "stopper",
      queue: "stop-q",
      waitMs: 10_000,
      handler: async () => {
        started = true;
        await sleep(500);
        finished = true;
        return { summary: "finished before the stop" };
      },
    });
    const run = worker.run();
    await eventually("the handler starts", async () => started);
    await worker.stop();
    assert.equal(finished, true);
    assert.equal(await run, 1);
    const call = await brood.getCall(callId);
    assert.equal(call.children[0]?.status, "succeeded");

    const idle = worker.run();
    await sleep(100);
    const stopping = Date.now();
    await worker.stop();
    assert.equal(await idle, 0);
    assert.ok(Date.now() - stopping < 2_000, "the 10 s poll was abandoned");
  });

  test("a handler that throws fails its child with the error's message", async () => {
    await delegateExternal("throws", "throw-q", ["doomed"]);
    const worker = new Worker(brood, {
      worker: "thrower",
      queue: "throw-q",
      waitMs: 1000,
      handler: () => {
        throw new Error("the disk is full");
      },
      onError: (e) => assert.fail(`no error is reported: ${e}`),
    });
    assert.equal(await worker.run({ maxItems: 1 }), 1);
    const [result] = await results(brood, "throws", 1);
    assert.equal(result?.status, "failed");
    assert.match(result?.error ?? "", /the disk is full/);
  });

  test("a child lost while its handler runs aborts the handler and is not completed", async () => {
    await delegateExternal("lost", "lost-q", ["cancelled under it"]);
    const counts = new Map<string, number>();
    const errors: unknown[] = [];
    let aborted = false;
    const worker = new Worker(server.client({ fetch: countingFetch(counts) }), {
      worker: "loser",
      queue: "lost-q",
      leaseMs: minLeaseMs,
      waitMs: 1000,
      handler: async (item: WorkItem, context) => {
        await brood.cancelChild(item.child_id);
        await new Promise((resolve) => context.signal.addEventListener("abort", resolve, { once: true }));
        aborted = true;
        return "too late";
      },
      onError: (e) => errors.push(e),
    });
    assert.equal(await worker.run({ maxItems: 1 }), 1);
    assert.equal(aborted, true);
    assert.equal(counts.get("complete"), undefined, "no completion was sent");
    assert.equal(errors.length, 1);
    const [lost] = errors;
    assert.ok(lost instanceof BroodError && lost.status === 409, String(lost));
  });

  test("a completion whose answer was lost is sent again", async () => {
    await delegateExternal("retry", "retry-q", ["once more"]);
    let completes = 0;
    const losesFirstAnswer: typeof fetch = async (input, init) => {
      const reply = await fetch(input, init);
      if (String(input).endsWith("/complete") && ++completes === 1) {
        throw new TypeError("fetch failed: the connection broke before the answer");
      }
      return reply;
    };
    const errors: unknown[] = [];
    const worker = new Worker(server.client({ fetch: losesFirstAnswer }), {
      worker: "retrier",
      queue: "retry-q",
      waitMs: 1000,
      handler: () => ({ summary: "sent twice, done once" }),
      onError: (e) => errors.push(e),
    });
    assert.equal(await worker.run({ maxItems: 1 }), 1);
    assert.equal(completes, 2);
    assert.deepEqual(errors, []);
    const [result] = await results(brood, "retry", 1);
    assert.deepEqual([result?.status, result?.summary], ["succeeded", "sent twice, done once"]);
  });
});
