/**
 * The client's methods against the real server: errors as the server states them, delegate →
 * boundary → ack exactly once, a busy release, and every other operation of the document.
 */

import assert from "node:assert/strict";
import { createServer, type Server, type Socket } from "node:net";
import { after, before, describe, test } from "node:test";

import { BroodError, Client, external, sim, type Envelope } from "../src/index.js";
import { freePort, startServer, type TestServer } from "./helpers/server.js";
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

describe("against an open server", () => {
  let server: TestServer;
  let brood: Client;
  before(async () => {
    server = await startServer();
    brood = server.client();
  });
  after(() => server.stop());

  test("a bad request is the server's status, code and message", async () => {
    await brood.putSession("errors");
    const e = await refusal(() => brood.delegate("errors", []));
    assert.equal(e.status, 400);
    assert.equal(e.code, "invalid_request");
    assert.match(e.message, /tasks/);
    assert.match(String(e), /^BroodError: 400 invalid_request: /);
    assert.equal(e.transient, false);
  });

  test("an unknown session is 404 unknown_session", async () => {
    const e = await refusal(() => brood.getSession("no-such-session"));
    assert.equal(e.status, 404);
    assert.equal(e.code, "unknown_session");
    assert.ok(e.message.length > 0);
  });

  test("delegate → boundary → ack delivers every result exactly once", async () => {
    await brood.putSession("once", { addressable: true });
    const tasks = [1, 2, 3, 4, 5].map((n) => ({ goal: `task ${n}`, runner: sim({ ms: 20 * n, summary: `done ${n}` }) }));
    const call = await brood.delegate("once", tasks, { independentCompletions: true });
    assert.equal(call.mode, "background");
    assert.ok("units" in call && call.units.length === 5, JSON.stringify(call));

    const seen = new Map<string, string | null>();
    while (seen.size < tasks.length) {
      const envelope = await nextEnvelope(brood, "once");
      for (const item of envelope.items) {
        assert.equal(item.call_id, call.call_id);
        assert.equal(item.kind, "result");
        assert.ok(!seen.has(item.child_id), `${item.child_id} came twice`);
        seen.set(item.child_id, item.summary ?? null);
      }
      const acked = await brood.ack(envelope.claim_id);
      assert.equal(acked.delivered, envelope.items.length);
      assert.deepEqual(await brood.ack(envelope.claim_id), acked, "acking again answers the same");
    }
    assert.deepEqual(
      [...seen.values()].sort(),
      tasks.map((_, i) => `done ${i + 1}`),
    );
    assert.equal(await brood.boundary("once", "test"), null, "nothing is left");
    const state = await brood.getSession("once");
    assert.equal(state.counts.delivered, tasks.length);
    assert.equal(state.counts.ready, 0);
  });

  test("a busy release hands the same items back without counting an attempt", async () => {
    await brood.putSession("busy", { addressable: true });
    await brood.delegate("busy", [{ goal: "one", runner: sim({ ms: 10 }) }]);
    const first = await nextEnvelope(brood, "busy");
    const released = await brood.release(first.claim_id, "busy");
    assert.deepEqual(released, { claim_id: first.claim_id, released: true });
    const lost = await refusal(() => brood.ack(first.claim_id));
    assert.equal(lost.status, 409);
    const again = await nextEnvelope(brood, "busy");
    assert.notEqual(again.claim_id, first.claim_id);
    assert.deepEqual(
      again.items.map((i) => [i.dedup_key, i.delivery_attempt]),
      first.items.map((i) => [i.dedup_key, i.delivery_attempt]),
    );
    assert.equal((await brood.ack(again.claim_id)).delivered, 1);
  });

  test("a sync delegate answers its results", async () => {
    await brood.putSession("sync");
    const reply = await brood.delegate("sync", [{ goal: "inline", runner: sim({ summary: "here" }) }], { mode: "sync" });
    assert.ok("results" in reply, JSON.stringify(reply));
    assert.equal(reply.mode, "sync");
    assert.deepEqual(
      reply.results.map((r) => [r.status, r.summary]),
      [["succeeded", "here"]],
    );
  });

  test("sessions are listed, read and turned", async () => {
    await brood.putSession("listed-a", { max_concurrent_children: 2 });
    await brood.putSession("listed-b");
    const page = await brood.listSessions({ after: "listed-", limit: 2 });
    assert.deepEqual(
      page.sessions.map((s) => s.session_id),
      ["listed-a", "listed-b"],
    );
    assert.equal(page.next, "listed-b");
    assert.equal((await brood.getSession("listed-a")).max_concurrent_children, 2);
    assert.deepEqual(await brood.setTurn("listed-a", "busy"), { session_id: "listed-a", turn: "busy" });
    assert.equal((await brood.getSession("listed-a")).turn, "busy");
  });

  test("a call is read and cancelled by call, unit and child", async () => {
    await brood.putSession("cancels", { addressable: true });
    const hang = { runner: sim({ outcome: "hang" }) };
    const call = await brood.delegate("cancels", [
      { goal: "a", ...hang, group: "g1" },
      { goal: "b", ...hang, group: "g2" },
      { goal: "c", ...hang, group: "g3" },
    ]);
    assert.ok("units" in call);
    const unitOfFirst = call.units.find((u) => u.tasks.includes(0))?.unit_id;
    assert.ok(unitOfFirst);
    const read = await brood.getCall(call.call_id);
    assert.equal(read.session_id, "cancels");
    assert.equal(read.children.length, 3);

    const byChild = await brood.cancelChild(`${call.call_id}.2`, { reason: "not needed" });
    assert.deepEqual(byChild, { cancelled: [`${call.call_id}.2`], already_finished: 0 });
    const byUnit = await brood.cancelUnit(unitOfFirst);
    assert.deepEqual(byUnit.cancelled, [`${call.call_id}.0`]);
    const byCall = await brood.cancelCall(call.call_id);
    assert.deepEqual(byCall, { cancelled: [`${call.call_id}.1`], already_finished: 2 });
    assert.deepEqual((await brood.cancelCall(call.call_id)).cancelled, [], "cancelling again cancels nothing");

    const ended = await brood.getCall(call.call_id);
    assert.deepEqual(
      ended.children.map((c) => c.status),
      ["cancelled", "cancelled", "cancelled"],
    );
    assert.equal((await refusal(() => brood.getCall("deleg_0"))).status, 404);
    assert.equal((await refusal(() => brood.cancelUnit("deleg_0-1"))).status, 404);
  });

  test("dead letters are listed and redriven", async () => {
    assert.deepEqual(await brood.deadLetters(), { items: [] });
    await brood.putSession("dead");
    assert.deepEqual(await brood.deadLetters({ sessionId: "dead" }), { items: [] });
    assert.deepEqual(await brood.redrive({ all: true }), { redriven: 0 });
    assert.deepEqual(await brood.redrive({ childIds: ["deleg_0.0"], limit: 1 }), { redriven: 0 });
    assert.deepEqual(await brood.redrive({ sessionId: "dead" }), { redriven: 0 });
  });

  test("the worker endpoints hand out, heartbeat and complete a child", async () => {
    await brood.putSession("hands", { addressable: true });
    await brood.delegate("hands", [{ goal: "by hand", runner: external("hands-q") }]);
    const item = await eventually("a work item", () =>
      brood.pollWork({ worker: "manual", queue: "hands-q", waitMs: 1000 }),
    );
    assert.equal(item.goal, "by hand");
    assert.equal((await brood.heartbeat(item.child_id, item.token, { progress: "half" })).child_id, item.child_id);
    const done = await brood.complete(item.child_id, item.token, { status: "succeeded", summary: "by hand done" });
    assert.equal(done.status, "succeeded");
    const stale = await refusal(() => brood.heartbeat(item.child_id, "not-a-token"));
    assert.equal(stale.status, 409);
    assert.equal(await brood.pollWork({ worker: "manual", queue: "hands-q" }), null);
    const envelope: Envelope = await nextEnvelope(brood, "hands");
    assert.equal(envelope.items[0]?.summary, "by hand done");
  });

  test("the operations answer", async () => {
    assert.equal((await brood.healthz()).status, "ok");
    assert.match(await brood.metrics(), /# EOF/);
    const doc = await brood.openapi();
    assert.match(String(doc["openapi"]), /^3\.1\./);
    assert.match(await brood.ui(), /<html/i);
  });
});

describe("against a server with a key", () => {
  let server: TestServer;
  before(async () => {
    server = await startServer({ apiKey: "ts-s3cret" });
  });
  after(() => server.stop());

  test("no key or a wrong key is 401, the key is accepted", async () => {
    for (const client of [new Client(server.url), new Client(server.url, { apiKey: "wrong" })]) {
      const e = await refusal(() => client.listSessions());
      assert.equal(e.status, 401);
      assert.equal(e.code, "unauthorized");
      assert.ok(e.message.length > 0);
    }
    const keyed = server.client();
    assert.equal((await keyed.putSession("keyed")).session_id, "keyed");
    assert.equal((await new Client(server.url).healthz()).status, "ok", "/healthz asks for no key");
  });
});

describe("without a usable server", () => {
  let silent: Server;
  const sockets: Socket[] = [];
  before(async () => {
    silent = createServer((socket) => sockets.push(socket));
    await new Promise<void>((resolve) => silent.listen(0, "127.0.0.1", resolve));
  });
  after(async () => {
    sockets.forEach((s) => s.destroy());
    await new Promise((resolve) => silent.close(resolve));
  });

  test("a server that cannot be reached is connection_failed", async () => {
    const port = await freePort();
    const e = await refusal(() => new Client(`http://127.0.0.1:${port}`).healthz());
    assert.equal(e.status, 0);
    assert.equal(e.code, "connection_failed");
    assert.match(e.message, new RegExp(`GET http://127\\.0\\.0\\.1:${port}/healthz`));
    assert.equal(e.transient, true);
  });

  test("a server that does not answer is a timeout", async () => {
    const address = silent.address();
    assert.ok(address !== null && typeof address === "object");
    const client = new Client(`http://127.0.0.1:${address.port}`, { timeoutMs: 200 });
    const started = Date.now();
    const e = await refusal(() => client.healthz());
    assert.equal(e.code, "timeout");
    assert.ok(Date.now() - started < 5_000);
    const aborted = await refusal(() => client.healthz({ signal: AbortSignal.abort(), timeoutMs: 10_000 }));
    assert.equal(aborted.code, "aborted");
  });
});
