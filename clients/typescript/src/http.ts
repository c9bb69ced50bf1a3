/**
 * The transport under {@link Client}: one HTTP request with the key, a time limit and the
 * caller's `AbortSignal`, every failure turned into a {@link BroodError}.
 */

import { BroodError, errorOfReply } from "./errors.js";
import { Holders, resendAtBase } from "./holder.js";

/** Per-request options every method of the client accepts. */
export interface RequestOptions {
  /** Ends the request (a {@link BroodError} with code `aborted`). */
  signal?: AbortSignal;
  /** The most milliseconds the request may take; the client's `timeoutMs` when left out. */
  timeoutMs?: number;
}

/** What the transport is built with. */
export interface TransportConfig {
  /** The server's root, e.g. `http://127.0.0.1:7070`. */
  baseUrl: string;
  /** Sent as `Authorization: Bearer <key>` when set. */
  apiKey?: string;
  /** The default time limit of a request, in milliseconds. */
  timeoutMs: number;
  /** The `fetch` to use. */
  fetch: typeof fetch;
  /** Send a session's requests to the process the last answer about it named (`X-Brood-Holder`). */
  followHolder?: boolean;
}

/** A query string's values; `undefined` ones are left out. */
export type Query = Record<string, string | number | boolean | undefined>;

/** One request to make. */
export interface Call {
  method: "GET" | "PUT" | "POST";
  /** The path, each id already a {@link segment}. */
  path: string;
  query?: Query;
  /** The JSON body; none when `undefined`. */
  body?: unknown;
  /** The `Accept` header (default `application/json`). */
  accept?: string;
  options?: RequestOptions | undefined;
  /** Milliseconds added to the time limit, for a request the server holds on purpose (a poll's `wait_ms`). */
  extraTimeoutMs?: number;
}

/** An id as one path segment, every reserved character escaped. */
export function segment(id: string): string {
  return encodeURIComponent(id);
}

/** `body` without its `undefined` fields, so the server applies its own defaults. */
export function compact<T extends object>(body: T): T {
  return Object.fromEntries(Object.entries(body).filter(([, v]) => v !== undefined)) as T;
}

/** A successful reply whose body is still to be read, and the means to stop waiting for it. */
export interface Opened {
  response: Response;
  /** The signal that ends reading the body (the caller's, or the time limit's). */
  signal: AbortSignal;
  /** Ends the time limit: for a body read as long as the caller wants (a stream). */
  endTimeLimit(): void;
  /** The error for a read of the body that threw `cause`. */
  failure(cause: unknown): BroodError;
  /** Ends the time limit and lets go of the caller's signal. */
  close(): void;
}

/** The HTTP transport of one server. */
export class Transport {
  readonly #config: TransportConfig;
  /** Where sessions' holders are, when the hint is followed. */
  readonly #holders: Holders | undefined;

  constructor(config: TransportConfig) {
    this.#config = { ...config, baseUrl: config.baseUrl.replace(/\/+$/, "") };
    this.#holders = config.followHolder ? new Holders() : undefined;
  }

  /** The server's root, without a trailing slash. */
  get baseUrl(): string {
    return this.#config.baseUrl;
  }

  /** Sends `call`; answers the reply of a 2xx status with its body unread, throws otherwise. */
  async open(call: Call): Promise<Opened> {
    const hinted = this.#holders?.root(call.path);
    let url = this.#url(call, hinted);
    let what = `${call.method} ${url}`;
    const limitMs = (call.options?.timeoutMs ?? this.#config.timeoutMs) + (call.extraTimeoutMs ?? 0);
    const limit = new Limit(call.options?.signal, limitMs);
    const failure = (cause: unknown): BroodError => limit.failure(what, cause);
    const headers: Record<string, string> = { Accept: call.accept ?? "application/json" };
    if (this.#config.apiKey !== undefined) {
      headers["Authorization"] = `Bearer ${this.#config.apiKey}`;
    }
    let body: string | undefined;
    if (call.body !== undefined) {
      body = JSON.stringify(call.body);
      headers["Content-Type"] = "application/json";
    }
    const send = (): Promise<Response> =>
      this.#config.fetch(url, { method: call.method, headers, body, signal: limit.signal });
    let response: Response;
    try {
      response = await send();
    } catch (cause) {
      if (hinted === undefined || this.#holders === undefined) {
        limit.close();
        throw failure(cause);
      }
      // The named holder did not answer: forgotten; a request that made no connection there
      // goes to the base URL at once (in what is left of its time limit).
      this.#holders.forget(call.path);
      if (limit.signal.aborted || !resendAtBase(cause)) {
        limit.close();
        throw failure(cause);
      }
      url = this.#url(call);
      what = `${call.method} ${url}`;
      try {
        response = await send();
      } catch (again) {
        limit.close();
        throw failure(again);
      }
    }
    this.#holders?.learn(call.path, response);
    if (!response.ok) {
      let text: string;
      try {
        text = await response.text();
      } catch (e) {
        throw failure(e);
      } finally {
        limit.close();
      }
      throw errorOfReply(response.status, text);
    }
    return {
      response,
      signal: limit.signal,
      endTimeLimit: () => limit.endTimer(),
      failure,
      close: () => limit.close(),
    };
  }

  /** Sends `call`; answers its parsed JSON, or `null` for a 204 (or an empty body). */
  async json<T>(call: Call): Promise<T | null> {
    const { status, text } = await this.#read(call);
    if (text.trim() === "") {
      return null;
    }
    try {
      return JSON.parse(text) as T;
    } catch (e) {
      throw new BroodError(status, "bad_reply", `${call.method} ${this.#url(call)}: the reply is not JSON: ${e}`);
    }
  }

  /** As {@link json}, for a request whose success always has a body. */
  async jsonBody<T>(call: Call): Promise<T> {
    const reply = await this.json<T>(call);
    if (reply === null) {
      throw new BroodError(0, "bad_reply", `${call.method} ${this.#url(call)}: the reply has no body`);
    }
    return reply;
  }

  /** Sends `call`; answers its body as text. */
  async text(call: Call): Promise<string> {
    return (await this.#read(call)).text;
  }

  async #read(call: Call): Promise<{ status: number; text: string }> {
    const opened = await this.open(call);
    try {
      return { status: opened.response.status, text: await opened.response.text() };
    } catch (e) {
      throw opened.failure(e);
    } finally {
      opened.close();
    }
  }

  #url(call: Call, root: string = this.#config.baseUrl): string {
    const query = new URLSearchParams();
    for (const [key, value] of Object.entries(call.query ?? {})) {
      if (value !== undefined) {
        query.set(key, String(value));
      }
    }
    const search = query.toString();
    return `${root}${call.path}${search ? `?${search}` : ""}`;
  }
}

/** A request's time limit joined with the caller's signal: one signal that ends it. */
class Limit {
  readonly #controller = new AbortController();
  readonly #callerSignal: AbortSignal | undefined;
  readonly #limitMs: number;
  #timer: ReturnType<typeof setTimeout> | undefined;
  #timedOut = false;
  readonly #onCallerAbort = (): void => this.#controller.abort(this.#callerSignal?.reason);

  constructor(callerSignal: AbortSignal | undefined, limitMs: number) {
    this.#callerSignal = callerSignal;
    this.#limitMs = limitMs;
    if (callerSignal?.aborted) {
      this.#controller.abort(callerSignal.reason);
    } else {
      callerSignal?.addEventListener("abort", this.#onCallerAbort, { once: true });
    }
    if (Number.isFinite(limitMs) && limitMs > 0) {
      this.#timer = setTimeout(() => {
        this.#timedOut = true;
        this.#controller.abort();
      }, limitMs);
    }
  }

  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  endTimer(): void {
    clearTimeout(this.#timer);
  }

  close(): void {
    this.endTimer();
    this.#callerSignal?.removeEventListener("abort", this.#onCallerAbort);
  }

  /** The error of `what` that failed with `cause`: timed out, aborted, or not connected. */
  failure(what: string, cause: unknown): BroodError {
    if (this.#timedOut) {
      return new BroodError(0, "timeout", `${what}: no reply within ${this.#limitMs} ms`, { cause });
    }
    if (this.#callerSignal?.aborted) {
      return new BroodError(0, "aborted", `${what}: aborted by the caller`, { cause });
    }
    return new BroodError(0, "connection_failed", `${what}: ${describe(cause)}`, { cause });
  }
}

/** The most telling words of a failed `fetch`: undici puts the system's error in `cause`. */
function describe(error: unknown): string {
  if (error instanceof Error) {
    const cause = error.cause;
    if (cause instanceof Error && cause.message) {
      return `${error.message} (${cause.message})`;
    }
    return error.message;
  }
  return String(error);
}
