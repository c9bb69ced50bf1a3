/**
 * Following the holder hint (`followHolder: true`): two `brood serve` processes sharing one
 * PostgreSQL database, a session served by `a`, and a client whose base URL is `b`. Following
 * the hint, the session's requests go to `a` once an answer named it, and `b` sends none on;
 * not following it, `b` sends every one on. A named process that does not answer sends the
 * request to the base URL again. The databases come from `BROOD_TEST_PG_DATABASES`.
 */

import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { BroodError, Client, sim } from "../src/index.js";
import { claimSession, holderAddress, Holders, sessionOf } from "../src/holder.js";
import { freePort, metric, startCluster, startServer, type TestServer } from "./helpers/server.js";
import { nextEnvelope } from "./helpers/wait.js";

const KEY = "ts-cluster-key";
/** Requests `b` sent on to the holder and answered with its answer. */
const RELAYED = 'brood_requests_forwarded_total{outcome="relayed"}';
/** Reads of one session a process answered (itself, or for a process that sent them on). */
const READS = 'brood_http_requests_total{route="/v1/sessions/{session_id}",method="GET",status="200"}';

let serial = 0;

/**
 * A fresh session opened through `node` (so served by it), whose answers through `through`
 * name `node` as its holder. A second one is opened through `through`, so the two processes keep
 * holding as many sessions each and neither hands one over to even them out.
 */
async function heldBy(node: TestServer, through: TestServer, name: string): Promise<string> {
  const sid = `${name}-${process.pid}-${serial++}`;
  await node.client().putSession(sid, { addressable: true });
  await through.client().putSession(`${name}-ballast-${process.pid}-${serial++}`);
  const reply = await fetch(`${through.url}/v1/sessions/${sid}`, { headers: { Authorization: `Bearer ${KEY}` } });
  assert.equal(reply.status, 200, await reply.text());
  assert.equal(reply.headers.get("x-brood-holder"), node.url);
  return sid;
}

describe("two processes on one database", () => {
  let cluster: Awaited<ReturnType<typeof startCluster>>;
  before(async () => {
    cluster = await startCluster(KEY);
  });
  after(() => cluster?.stop());

  test("a client following the hint sends the session's requests to its holder", async () => {
    const { a, b } = cluster;
    const sid = await heldBy(a, b, "follow");
    const relayed = await metric(b, RELAYED);
    const brood = b.client({ followHolder: true });
    assert.equal((await brood.getSession(sid)).session_id, sid);
    assert.equal(await metric(b, RELAYED), relayed + 1, "the first request went through b");
    const reads = await metric(a, READS);
    for (let i = 0; i < 5; i++) {
      assert.equal((await brood.getSession(sid)).session_id, sid);
    }
    await brood.delegate(sid, [{ goal: "t", runner: sim({ ms: 5 }) }]);
    const envelope = await nextEnvelope(brood, sid);
    assert.equal((await brood.ack(envelope.claim_id)).delivered, 1);
    assert.equal((await brood.getSession(sid)).counts.ready, 0);
    assert.ok((await metric(a, READS)) >= reads + 6, "a answered every read");
    assert.equal(await metric(b, RELAYED), relayed + 1, "after an answer named a, b sent no request on");
  });

  test("a client not following the hint has every request sent on", async () => {
    const { a, b } = cluster;
    const sid = await heldBy(a, b, "stay");
    const relayed = await metric(b, RELAYED);
    const brood = b.client();
    for (let i = 0; i < 5; i++) {
      assert.equal((await brood.getSession(sid)).session_id, sid);
    }
    assert.equal(await metric(b, RELAYED), relayed + 5, "b sent each request on to a");
  });
});

test("a holder that does not answer sends the request to the base URL", async () => {
  const cluster = await startCluster(KEY);
  try {
    const { a, b } = cluster;
    const sid = await heldBy(a, b, "gone");
    const brood = b.client({ followHolder: true });
    assert.equal((await brood.getSession(sid)).session_id, sid);
    await a.kill();
    // Each request first tries a, which refuses the connection, then goes to b: it answers 503
    // while a's tenure of the session lasts, then serves it. No request fails for want of a
    // connection.
    const deadline = Date.now() + 60_000;
    let refused = 0;
    for (;;) {
      try {
        assert.equal((await brood.getSession(sid)).session_id, sid);
        break;
      } catch (e) {
        assert.ok(e instanceof BroodError && e.status === 503, `a 503 while b takes the session over, not ${e}`);
        refused++;
        assert.ok(Date.now() < deadline, `b did not take the session over in 60 s (${refused} 503s)`);
        await sleep(50);
      }
    }
    const relayed = await metric(b, RELAYED);
    assert.equal((await brood.getSession(sid)).session_id, sid);
    assert.equal(await metric(b, RELAYED), relayed, "b serves the session itself now");
  } finally {
    await cluster.stop();
  }
});

test("a hint of a closed port is forgotten and the base URL answers", async () => {
  const server = await startServer();
  try {
    const closed = `http://127.0.0.1:${await freePort()}`;
    const seen: string[] = [];
    // The first answer names a holder on a port nothing listens on.
    let told = false;
    const telling: typeof fetch = async (input, init) => {
      seen.push(String(input));
      const reply = await fetch(input, init);
      if (told) {
        return reply;
      }
      told = true;
      const headers = new Headers(reply.headers);
      headers.set("x-brood-holder", closed);
      return new Response(await reply.arrayBuffer(), { status: reply.status, headers });
    };
    const brood = new Client(server.url, { fetch: telling, followHolder: true });
    await brood.putSession("closed");
    assert.equal((await brood.getSession("closed")).session_id, "closed");
    assert.deepEqual(seen, [
      `${server.url}/v1/sessions/closed`,
      `${closed}/v1/sessions/closed`,
      `${server.url}/v1/sessions/closed`,
    ]);
    // Forgotten: the next request goes to the base URL alone.
    await brood.getSession("closed");
    assert.equal(seen.at(-1), `${server.url}/v1/sessions/closed`);
    assert.equal(seen.length, 4);
  } finally {
    await server.stop();
  }
});

test("what the hint names and what it is about", () => {
  assert.equal(sessionOf("/v1/sessions/chat-1"), "chat-1");
  assert.equal(sessionOf("/v1/sessions/a%2Fb/boundary"), "a/b");
  assert.equal(sessionOf("/v1/sessions"), undefined);
  assert.equal(sessionOf("/v1/calls/deleg_1"), undefined);
  const claim = `clm_${Buffer.from("chat-1").toString("hex")}_0123`;
  assert.equal(claimSession(claim), "chat-1");
  assert.equal(sessionOf(`/v1/claims/${claim}/ack`), "chat-1");
  assert.equal(claimSession("clm_zz_1"), undefined);
  assert.equal(claimSession("other"), undefined);
  assert.equal(holderAddress("http://10.0.0.7:4100"), "http://10.0.0.7:4100");
  assert.equal(holderAddress("https://b.example/"), "https://b.example");
  for (const bad of [null, "", "ftp://b:1", "b:4100", "http://", "http://b/x", "http://u:p@b", "javascript:x"]) {
    assert.equal(holderAddress(bad), undefined, String(bad));
  }

  const holders = new Holders();
  const path = `/v1/claims/${claim}/release`;
  const answer = (status: number, holder: string): Response =>
    new Response(null, { status, headers: { "x-brood-holder": holder } });
  holders.learn("/v1/sessions/chat-1", answer(200, "http://b:1"));
  assert.equal(holders.root(path), "http://b:1", "a claim goes where its session is");
  holders.learn("/v1/sessions/chat-1", answer(503, "http://b:1"));
  assert.equal(holders.root(path), undefined, "a 503 forgets the holder");
  holders.learn(path, answer(200, "ftp://b:1"));
  assert.equal(holders.root(path), undefined, "only http and https are followed");
});
