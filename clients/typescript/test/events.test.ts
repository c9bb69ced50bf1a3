/**
 * The event stream: the frame parser on awkward input, the typed iterator against the real
 * server, and a stream that ends with `dropped`.
 */

import assert from "node:assert/strict";
import { createServer, type Server } from "node:http";
import { after, before, describe, test } from "node:test";

import { BroodError, Client, eventOf, parseSse, sim, type BroodEvent, type SseFrame } from "../src/index.js";
import { startServer, type TestServer } from "./helpers/server.js";

/** The frames of `text` delivered in chunks of `size` bytes. */
async function framesOf(text: string, size: number): Promise<SseFrame[]> {
  const bytes = new TextEncoder().encode(text);
  async function* chunks(): AsyncGenerator<Uint8Array> {
    for (let at = 0; at < bytes.length; at += size) {
      yield bytes.slice(at, at + size);
    }
  }
  const frames: SseFrame[] = [];
  for await (const frame of parseSse(chunks())) {
    frames.push(frame);
  }
  return frames;
}

describe("the frame parser", () => {
  const stream =
    ": keep-alive\n\n" +
    "id: 0\nevent: ready\ndata: {\"ready\":0}\n\n" +
    "id: 7\r\nevent: child\r\ndata: {\"a\":\r\ndata: 1}\r\n\r\n" +
    "event: claim\rdata:no-space\r\r" +
    "event: nothing\nid: 9\n\n" +
    "retry: 100\ndata: plain é\n\n" +
    "event: unfinished\ndata: x\n";

  test("reads fields, line ends and comments, whatever the chunks", async () => {
    const want: SseFrame[] = [
      { event: "ready", data: '{"ready":0}', id: "0" },
      { event: "child", data: '{"a":\n1}', id: "7" },
      { event: "claim", data: "no-space", id: undefined },
      { event: "message", data: "plain é", id: undefined },
    ];
    for (const size of [1, 2, 3, 7, 64, 4096]) {
      assert.deepEqual(await framesOf(stream, size), want, `chunks of ${size}`);
    }
  });

  test("a stream ending in a CR ends its last line there", async () => {
    assert.deepEqual(await framesOf("data: last\r\r", 1), [{ event: "message", data: "last", id: undefined }]);
  });

  test("frames become typed events; unknown names are skipped, bad JSON refused", () => {
    const dropped = eventOf({ event: "dropped", data: '{"reason":"lagged","missed":3}', id: undefined });
    assert.deepEqual(dropped, { event: "dropped", id: undefined, data: { reason: "lagged", missed: 3 } });
    assert.equal(eventOf({ event: "newer", data: "{}", id: "1" }), undefined);
    assert.throws(
      () => eventOf({ event: "ready", data: "{", id: "1" }),
      (e: unknown) => e instanceof BroodError && e.code === "bad_reply",
    );
  });
});

describe("a session's events from the server", () => {
  let server: TestServer;
  let brood: Client;
  before(async () => {
    server = await startServer();
    brood = server.client();
  });
  after(() => server.stop());

  test("open with ready, tell a child's run, and end when the signal aborts", async () => {
    await brood.putSession("watched", { addressable: true });
    const stop = new AbortController();
    const seen: BroodEvent[] = [];
    let delegated = false;
    for await (const ev of brood.events("watched", { signal: stop.signal })) {
      seen.push(ev);
      if (!delegated) {
        delegated = true;
        await brood.delegate("watched", [{ goal: "watched", runner: sim({ ms: 20 }) }]);
      }
      if (ev.event === "ready" && ev.data.ready > 0) {
        stop.abort();
      }
    }
    const [first] = seen;
    assert.ok(first?.event === "ready", JSON.stringify(first));
    assert.equal(first.id, "0");
    assert.equal(first.data.seq, 0);
    assert.equal(first.data.ready, 0);
    assert.equal(first.data.session_id, "watched");
    const statuses = seen.flatMap((ev) => (ev.event === "child" ? [ev.data.status] : []));
    assert.deepEqual(statuses.slice(-1), ["succeeded"], JSON.stringify(seen));
    const last = seen[seen.length - 1];
    assert.ok(last?.event === "ready" && last.data.ready === 1, JSON.stringify(last));
    assert.equal(last.id, String(last.data.seq));
  });

  test("an unknown session is refused at the first read", async () => {
    const events = brood.events("nobody-here");
    await assert.rejects(events.next(), (e: unknown) => e instanceof BroodError && e.status === 404);
  });
});

describe("a stream that fell behind", () => {
  let fake: Server;
  let url: string;
  before(async () => {
    fake = createServer((_, res) => {
      res.writeHead(200, { "Content-Type": "text/event-stream" });
      res.write('id: 0\nevent: ready\ndata: {"session_id":"s","seq":0,"at":1,"ready":0}\n\n');
      res.end('event: dropped\ndata: {"reason":"lagged","missed":12}\n\n');
    });
    await new Promise<void>((resolve) => fake.listen(0, "127.0.0.1", resolve));
    const address = fake.address();
    assert.ok(address !== null && typeof address === "object");
    url = `http://127.0.0.1:${address.port}`;
  });
  after(() => new Promise((resolve) => fake.close(resolve)));

  test("yields `dropped` and ends", async () => {
    const seen: BroodEvent[] = [];
    for await (const ev of new Client(url).events("s")) {
      seen.push(ev);
    }
    assert.deepEqual(
      seen.map((ev) => ev.event),
      ["ready", "dropped"],
    );
    const dropped = seen[1];
    assert.ok(dropped?.event === "dropped");
    assert.equal(dropped.data.missed, 12);
    assert.equal(dropped.id, undefined);
  });
});
