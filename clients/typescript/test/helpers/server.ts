/**
 * The real `brood serve` for the tests: the binary named by `BROOD_BIN`, on a free loopback
 * port over a temporary data folder, stopped (and its folder removed) by {@link TestServer.stop}.
 */

import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";

import { Client, type ClientOptions } from "../../src/index.js";

/** How long a server may take to answer `/healthz` after it starts. */
const START_MS = 30_000;

/** A running server. */
export interface TestServer {
  /** `http://127.0.0.1:<port>`. */
  url: string;
  /** The server's key, when it has one. */
  apiKey: string | undefined;
  /** A client of it (with its key). */
  client(options?: ClientOptions): Client;
  /** Kills it at once (SIGKILL), as in a crash; {@link stop} still removes its folder. */
  kill(): Promise<void>;
  /** Stops it and removes its data folder. */
  stop(): Promise<void>;
}

/** The binary under test: `BROOD_BIN`, or a failure saying it is missing. */
export function broodBin(): string {
  const bin = process.env["BROOD_BIN"];
  if (!bin) {
    throw new Error(
      "BROOD_BIN is not set: these tests run the real server; set it to the brood binary " +
        "(`cargo test --test typescript_client` does), e.g. BROOD_BIN=../../target/debug/brood npm test",
    );
  }
  return bin;
}

/** A loopback port free now. */
export async function freePort(): Promise<number> {
  const probe = createServer();
  await new Promise<void>((resolve, reject) => {
    probe.once("error", reject);
    probe.listen(0, "127.0.0.1", resolve);
  });
  const address = probe.address();
  await new Promise((resolve) => probe.close(resolve));
  if (address === null || typeof address === "string") {
    throw new Error("no port was given");
  }
  return address.port;
}

/** Starts `brood serve` (with `apiKey`, and `args` added); resolves once it answers `/healthz`. */
export async function startServer(options: { apiKey?: string; args?: string[] } = {}): Promise<TestServer> {
  const bin = broodBin();
  const dataDir = await mkdtemp(join(tmpdir(), "brood-ts-"));
  const url = `http://127.0.0.1:${await freePort()}`;
  const args = ["serve", "--listen", url.slice("http://".length), "--data-dir", dataDir, ...(options.args ?? [])];
  if (options.apiKey !== undefined) {
    args.push("--api-key", options.apiKey);
  }
  // The server refuses to start beside a `BROOD_*` variable it does not know (`BROOD_BIN`
  // among them), and would read `BROOD_API_KEY`: it gets none of them.
  const env = Object.fromEntries(Object.entries(process.env).filter(([name]) => !name.startsWith("BROOD_")));
  const child = spawn(bin, args, { env, stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  child.stderr?.setEncoding("utf8").on("data", (text: string) => {
    stderr = (stderr + text).slice(0, 8000);
  });
  const exited = new Promise<void>((resolve) => child.once("exit", () => resolve()));
  const failedToStart = new Promise<never>((_, reject) => child.once("error", reject));

  const server: TestServer = {
    url,
    apiKey: options.apiKey,
    client: (clientOptions = {}) => new Client(url, { apiKey: options.apiKey, ...clientOptions }),
    kill: async () => {
      if (child.exitCode === null && child.signalCode === null) {
        child.kill("SIGKILL");
        await exited;
      }
    },
    stop: async () => {
      await stop(child, exited);
      await rm(dataDir, { recursive: true, force: true });
    },
  };
  try {
    await Promise.race([waitHealthy(url, child), failedToStart]);
  } catch (e) {
    await server.stop();
    throw new Error(`${bin} serve did not start: ${e}\n--- its stderr:\n${stderr}`);
  }
  return server;
}

async function waitHealthy(url: string, child: ChildProcess): Promise<void> {
  const deadline = Date.now() + START_MS;
  while (Date.now() < deadline) {
    if (child.exitCode !== null || child.signalCode !== null) {
      throw new Error(`it exited (${child.exitCode ?? child.signalCode}) before it answered /healthz`);
    }
    try {
      const reply = await fetch(`${url}/healthz`, { signal: AbortSignal.timeout(1000) });
      if (reply.status === 200) {
        return;
      }
    } catch {
      // Not listening yet.
    }
    await sleep(50);
  }
  throw new Error(`no 200 from /healthz within ${START_MS} ms`);
}

async function stop(child: ChildProcess, exited: Promise<void>): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) {
    return;
  }
  child.kill("SIGTERM");
  const patience = new AbortController();
  const stuck = sleep(10_000, true, { signal: patience.signal }).catch(() => false);
  const killed = await Promise.race([exited.then(() => false), stuck]);
  patience.abort();
  if (killed) {
    child.kill("SIGKILL");
    await exited;
  }
}

/**
 * The variable naming, space-separated, the empty PostgreSQL databases the tests of several
 * processes on one database use (`cargo test --test typescript_client` makes them).
 */
export const DATABASES = "BROOD_TEST_PG_DATABASES";

const taken = new Set<string>();

/**
 * An empty PostgreSQL database no other test of this run uses; an error (not a skip) when none
 * was given: the tests of several processes must run.
 */
export function database(): string {
  const given = (process.env[DATABASES] ?? "").split(/\s+/).filter((d) => d !== "");
  if (given.length === 0) {
    throw new Error(
      `${DATABASES} is not set: name empty PostgreSQL databases, space-separated, for the tests of several ` +
        "processes on one database (`cargo test --test typescript_client` makes them)",
    );
  }
  const free = given.find((d) => !taken.has(d));
  if (free === undefined) {
    throw new Error(`${DATABASES} names ${given.length} databases, and every one is taken`);
  }
  taken.add(free);
  return free;
}

/** Processes `a` and `b` of `brood serve` sharing one PostgreSQL database, with the key `apiKey`. */
export async function startCluster(apiKey: string): Promise<{ a: TestServer; b: TestServer; stop(): Promise<void> }> {
  const url = database();
  const node = (name: string): Promise<TestServer> =>
    startServer({ apiKey, args: ["--ledger", url, "--node", name, "--session-lease-ms", "2000"] });
  const a = await node("a");
  let b: TestServer;
  try {
    b = await node("b");
  } catch (e) {
    await a.stop();
    throw e;
  }
  return { a, b, stop: async () => void (await Promise.all([a.stop(), b.stop()])) };
}

/** The value of one sample of the server's `/metrics` (`name{label="v"}` as encoded); 0 when absent. */
export async function metric(server: TestServer, series: string): Promise<number> {
  const headers: Record<string, string> = server.apiKey === undefined ? {} : { Authorization: `Bearer ${server.apiKey}` };
  const text = await (await fetch(`${server.url}/metrics`, { headers })).text();
  for (const line of text.split("\n")) {
    if (line.startsWith(`${series} `)) {
      return Number(line.slice(series.length + 1).split(" ")[0]);
    }
  }
  return 0;
}
