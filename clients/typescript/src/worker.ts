/**
 * The worker kit: a loop that long-polls a queue for external children, runs a handler on
 * each while heartbeating its lease, and completes it with the handler's outcome.
 */

import type { Client, Completion } from "./client.js";
import { BroodError } from "./errors.js";
import type { Json, WorkItem } from "./types.js";

/** What a handler may answer besides bare output: a summary, output, or both. */
export interface WorkResult {
  /** What came of the work, in words. */
  summary?: string | null;
  /** What came of it, as JSON. */
  output?: Json;
}

/**
 * What a handler answers: `undefined` (succeeded, nothing to say), a {@link WorkResult} (an
 * object whose only keys are `summary` and/or `output`), or any other JSON value, sent as the
 * child's `output`. To send output that itself looks like a `WorkResult`, wrap it:
 * `{ output: { summary: "…" } }`.
 */
export type HandlerResult = WorkResult | Json | undefined | void;

/** What a handler is given beside the work item. */
export interface WorkContext {
  /** Aborted when the child was lost (a heartbeat found the lease gone); stop working then. */
  signal: AbortSignal;
  /** Sets the progress text the next heartbeats send. */
  progress(text: string): void;
}

/** The work of one child: its output, or a throw (the child fails with the error's message). */
export type Handler = (item: WorkItem, context: WorkContext) => HandlerResult | Promise<HandlerResult>;

/** How a {@link Worker} is made. */
export interface WorkerOptions {
  /** The worker's name (1 to 256 characters). */
  worker: string;
  /** The queue to poll (default `default`). */
  queue?: string;
  /** Runs one child. */
  handler: Handler;
  /** The lease to ask for, in ms (the server's default when left out). */
  leaseMs?: number;
  /** How long one poll waits for a child, in ms (default 10000, at most 30000). */
  waitMs?: number;
  /** The heartbeat interval as a fraction of the item's lease (default 1/3). */
  heartbeatFraction?: number;
  /**
   * Told of what went wrong without stopping the worker: a failed poll or heartbeat, a lost
   * child, a completion given up. Default: a warning on the console.
   */
  onError?: (error: unknown, item: WorkItem | undefined) => void;
}

/** Options of {@link Worker.run}. */
export interface RunOptions {
  /** Stop after handling this many children (default: until {@link Worker.stop}). */
  maxItems?: number;
}

/** The waits between retries of a request that may succeed later: 100 ms doubling to 5 s. */
const RETRY_FIRST_MS = 100;
const RETRY_MOST_MS = 5_000;

/**
 * Runs external children from one queue, one at a time:
 *
 * ```ts
 * const worker = new Worker(client, { worker: "w1", queue: "default", handler: async (item) => {
 *   return { summary: `did ${item.goal}`, output: { ok: true } };
 * }});
 * const handled = await worker.run();   // until worker.stop()
 * ```
 *
 * While the handler runs the lease is renewed every `heartbeatFraction` of it; a heartbeat
 * answered 409 means the child was lost (its lease ran out and it went back to the queue): the
 * handler's `signal` aborts and its outcome is not sent. The outcome is sent as `succeeded`
 * (with the handler's summary and output) or `failed` (with the thrown error's message); a
 * completion whose answer was lost is sent again (the server answers a repeat the same), and
 * a 409 (`child_ended`, `stale_token`) gives the item up. Output the server refuses (400, e.g.
 * too large) fails the child with the server's message rather than leaving it to time out.
 */
export class Worker {
  readonly #client: Client;
  readonly #options: WorkerOptions;
  #running: Promise<number> | undefined;
  #stop: AbortController | undefined;

  constructor(client: Client, options: WorkerOptions) {
    this.#client = client;
    this.#options = options;
  }

  /** Whether {@link run} is under way. */
  get running(): boolean {
    return this.#running !== undefined;
  }

  /**
   * Polls and handles children until {@link stop} is called or `maxItems` were handled;
   * resolves with the count handled. It rejects on a poll refused for good (a wrong key, a bad
   * queue name); a poll that may succeed later is retried with backoff.
   */
  run(options: RunOptions = {}): Promise<number> {
    if (this.#running !== undefined) {
      return Promise.reject(new Error(`worker ${this.#options.worker} is running already`));
    }
    const stop = new AbortController();
    this.#stop = stop;
    this.#running = this.#loop(options.maxItems ?? Infinity, stop.signal).finally(() => {
      this.#running = undefined;
    });
    return this.#running;
  }

  /**
   * Stops polling; resolves once the child being handled (if any) is completed. A poll under
   * way is abandoned: a child the server handed out in that instant goes back to the queue
   * when its lease runs out.
   */
  async stop(): Promise<void> {
    this.#stop?.abort();
    await this.#running?.catch(() => undefined);
  }

  async #loop(maxItems: number, stopped: AbortSignal): Promise<number> {
    let handled = 0;
    let retryMs = RETRY_FIRST_MS;
    while (!stopped.aborted && handled < maxItems) {
      let item: WorkItem | null;
      try {
        item = await this.#client.pollWork({
          worker: this.#options.worker,
          queue: this.#options.queue,
          waitMs: this.#options.waitMs ?? 10_000,
          leaseMs: this.#options.leaseMs,
          signal: stopped,
        });
      } catch (e) {
        if (stopped.aborted) {
          break;
        }
        if (!(e instanceof BroodError) || !e.transient) {
          throw e;
        }
        this.#report(e, undefined);
        await sleep(retryMs, stopped);
        retryMs = Math.min(retryMs * 2, RETRY_MOST_MS);
        continue;
      }
      retryMs = RETRY_FIRST_MS;
      if (item !== null) {
        await this.#handle(item);
        handled += 1;
      }
    }
    return handled;
  }

  /** Runs the handler on `item` under heartbeats, then sends its outcome. */
  async #handle(item: WorkItem): Promise<void> {
    const lost = new AbortController();
    const fraction = this.#options.heartbeatFraction ?? 1 / 3;
    const beats = new Heartbeats(this.#client, item, Math.max(100, item.lease_ms * fraction), (e, gone) => {
      this.#report(e, item);
      if (gone) {
        lost.abort(e);
      }
    });
    let completion: Completion;
    try {
      const result = await this.#options.handler(item, {
        signal: lost.signal,
        progress: (text) => beats.setProgress(text),
      });
      completion = completionOf(result);
    } catch (e) {
      completion = { status: "failed", error: messageOf(e) };
    } finally {
      await beats.stop();
    }
    if (!lost.signal.aborted) {
      await this.#complete(item, completion);
    }
  }

  /** Sends `completion`, again while the server may not have had it, within the item's lease. */
  async #complete(item: WorkItem, completion: Completion): Promise<void> {
    const giveUpAt = Date.now() + item.lease_ms;
    let retryMs = RETRY_FIRST_MS;
    for (;;) {
      try {
        await this.#client.complete(item.child_id, item.token, completion);
        return;
      } catch (e) {
        if (e instanceof BroodError && e.status === 400 && completion.output !== undefined) {
          this.#report(e, item);
          completion = { status: "failed", error: `the server refused the child's output: ${e.message}` };
          continue;
        }
        if (e instanceof BroodError && e.transient && Date.now() < giveUpAt) {
          await sleep(retryMs);
          retryMs = Math.min(retryMs * 2, RETRY_MOST_MS);
          continue;
        }
        this.#report(e, item);
        return;
      }
    }
  }

  #report(error: unknown, item: WorkItem | undefined): void {
    if (this.#options.onError) {
      this.#options.onError(error, item);
    } else {
      const about = item ? ` (child ${item.child_id})` : "";
      console.warn(`brood worker ${this.#options.worker}${about}: ${String(error)}`);
    }
  }
}

/**
 * Renews an item's lease every `everyMs` until stopped; tells `onFailure` of a heartbeat that
 * failed, with `gone` true and no more beats when it was refused for good (the child is lost).
 */
class Heartbeats {
  readonly #client: Client;
  readonly #item: WorkItem;
  readonly #everyMs: number;
  readonly #onFailure: (error: unknown, gone: boolean) => void;
  #progress: string | undefined;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #beating: Promise<void> = Promise.resolve();
  #stopped = false;

  constructor(client: Client, item: WorkItem, everyMs: number, onFailure: (error: unknown, gone: boolean) => void) {
    this.#client = client;
    this.#item = item;
    this.#everyMs = everyMs;
    this.#onFailure = onFailure;
    this.#schedule();
  }

  setProgress(text: string): void {
    this.#progress = text;
  }

  /** Stops beating; resolves once a heartbeat under way has its answer. */
  async stop(): Promise<void> {
    this.#stopped = true;
    clearTimeout(this.#timer);
    await this.#beating;
  }

  #schedule(): void {
    if (this.#stopped) {
      return;
    }
    this.#timer = setTimeout(() => {
      this.#beating = this.#beat().then(() => this.#schedule());
    }, this.#everyMs);
  }

  async #beat(): Promise<void> {
    try {
      await this.#client.heartbeat(this.#item.child_id, this.#item.token, {
        progress: this.#progress,
        timeoutMs: this.#everyMs,
      });
    } catch (e) {
      // One that may succeed later is tried again at the next beat: the lease has room for two.
      const gone = e instanceof BroodError && !e.transient;
      this.#stopped ||= gone;
      this.#onFailure(e, gone);
    }
  }
}

/** The completion of a handler's answer. */
function completionOf(result: HandlerResult): Completion {
  if (result === undefined) {
    return { status: "succeeded" };
  }
  if (isWorkResult(result)) {
    const completion: Completion = { status: "succeeded", summary: result.summary };
    if (result.output !== undefined) {
      completion.output = result.output;
    }
    return completion;
  }
  return { status: "succeeded", output: result as Json };
}

/** Whether `value` is a {@link WorkResult}: a plain object whose only keys are `summary` and/or `output`. */
function isWorkResult(value: unknown): value is WorkResult {
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    return false;
  }
  const keys = Object.keys(value);
  return keys.length > 0 && keys.every((k) => k === "summary" || k === "output");
}

/** A thrown value's message, for the child's `error`. */
function messageOf(error: unknown): string {
  if (error instanceof Error) {
    return error.message || error.name;
  }
  return String(error);
}

/** Resolves after `ms`, or at once when `signal` aborts. */
function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) {
      resolve();
      return;
    }
    const done = (): void => {
      clearTimeout(timer);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}
