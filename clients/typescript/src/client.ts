/**
 * {@link Client}: one method per operation of brood's HTTP API, version 1.
 */

import { streamEvents } from "./events.js";
import { compact, segment, Transport, type RequestOptions } from "./http.js";
import type {
  AckReply,
  BoundaryBody,
  BroodEvent,
  CallDetail,
  CancelReply,
  CompleteBody,
  CompleteReply,
  DeadLetters,
  DelegateBody,
  Delegation,
  Envelope,
  Health,
  HeartbeatReply,
  PutSessionBody,
  Readiness,
  RedriveReply,
  ReleaseReason,
  ReleaseReply,
  Session,
  SessionDetail,
  SessionList,
  TakeBody,
  Task,
  TurnReply,
  TurnState,
  WorkItem,
} from "./types.js";

/** How a {@link Client} is made. */
export interface ClientOptions {
  /** Sent as `Authorization: Bearer <key>` on every request (needed by a server with a key). */
  apiKey?: string;
  /** The default time limit of a request, in milliseconds (default 30000). */
  timeoutMs?: number;
  /** The `fetch` to use (default the global one). */
  fetch?: typeof fetch;
  /**
   * With several `brood serve` processes sharing one database: remember, for each session, the
   * process the last answer about it named (`X-Brood-Holder`), and send that session's next
   * requests (its claims' too) there, with the same headers and key, sparing each a hop between
   * processes. After a 503, or when the named process cannot be reached, the client forgets it
   * and sends to `baseUrl` again (a request that could not connect there is sent to `baseUrl` at
   * once). Off by default: a client behind a load balancer may not reach the processes' own
   * addresses.
   */
  followHolder?: boolean;
}

/** Options of {@link Client.getSession}. */
export interface GetSessionOptions extends RequestOptions {
  /** `true`: every stored call, delivered ones too; otherwise the calls not yet delivered. */
  delivered?: boolean;
  /** The page of calls starts after this call id. */
  after?: string;
  /** Calls per page (default 100). */
  limit?: number;
}

/** Options of {@link Client.listSessions}. */
export interface ListSessionsOptions extends RequestOptions {
  /** Sessions per page (default 100, at most 1000). */
  limit?: number;
  /** The page starts after this session id (the previous page's `next`). */
  after?: string;
}

/** Options of {@link Client.delegate}. */
export interface DelegateOptions extends RequestOptions {
  /** `background` (default: results at boundaries) or `sync` (results in the reply). */
  mode?: DelegateBody["mode"];
  /** Each ungrouped task its own unit (default: one unit for them all). */
  independentCompletions?: boolean;
  /** The caller's W3C trace context, carried to every child. */
  traceparent?: string;
  /**
   * Sent as the body's `idempotency_key`: repeating the delegate with the same key and body
   * answers the first call's reply; the same key with another body is 409
   * `idempotency_conflict`.
   */
  idempotencyKey?: string;
}

/** Options of {@link Client.boundary}. */
export interface BoundaryOptions extends RequestOptions {
  /** The claim's lease in ms (default 60000): ack or release within it. */
  leaseMs?: number;
  /** Items at most in the envelope; the rest stay ready (`more` says so). */
  maxItems?: number;
  /** Bytes at most of the envelope's items; at least one item is handed out. */
  maxBytes?: number;
  /**
   * A claim of this session to ack first, in the same request; a refused ack rejects with its
   * error and nothing is claimed.
   */
  ack?: string;
}

/** Options of {@link Client.release}. */
export interface ReleaseOptions extends RequestOptions {
  /** The least time before the items are ready again, in ms. */
  retryAfterMs?: number;
}

/** Options of the cancels. */
export interface CancelOptions extends RequestOptions {
  /** Why: kept in each cancelled child's error. */
  reason?: string;
}

/** Which dead letters {@link Client.redrive} puts back: exactly one selector, and a limit. */
export type RedriveSelection = ({ childIds: string[] } | { sessionId: string } | { all: true }) & {
  /** At most this many (the oldest dead first). */
  limit?: number;
};

/** Options of {@link Client.pollWork}. */
export interface PollOptions extends RequestOptions {
  /** The worker's name. */
  worker: string;
  /** The queue to take from (default `default`). */
  queue?: string;
  /** How long the server may hold the poll for a child, in ms (0 to 30000, default 0). */
  waitMs?: number;
  /** The lease of the child handed out, in ms (default 30000); heartbeats renew it. */
  leaseMs?: number;
}

/** A worker's outcome of a child, for {@link Client.complete}. */
export type Completion = Omit<CompleteBody, "token">;

/**
 * A client of one brood server. Replies are the server's JSON as it came, typed by the OpenAPI
 * document (a field the server adds later is kept). Every failure is a `BroodError`.
 *
 * ```ts
 * const brood = new Client("http://127.0.0.1:7070");
 * await brood.putSession("chat-1", { addressable: true });
 * await brood.delegate("chat-1", [{ goal: "review PR 12", runner: sim({ ms: 50 }) }]);
 * const envelope = await brood.boundary("chat-1", "cli");
 * if (envelope) await brood.ack(envelope.claim_id);
 * ```
 */
export class Client {
  readonly #http: Transport;

  /** A client of the server at `baseUrl` (e.g. `http://127.0.0.1:7070`). */
  constructor(baseUrl: string, options: ClientOptions = {}) {
    this.#http = new Transport({
      baseUrl,
      apiKey: options.apiKey,
      timeoutMs: options.timeoutMs ?? 30_000,
      fetch: options.fetch ?? globalThis.fetch,
      followHolder: options.followHolder ?? false,
    });
  }

  /** The server's root. */
  get baseUrl(): string {
    return this.#http.baseUrl;
  }

  // --- Sessions -------------------------------------------------------------------------------

  /** `PUT /v1/sessions/{id}`: makes or changes a session. A `wake_url` or `addressable: true` makes it wake-capable. */
  putSession(sessionId: string, settings: PutSessionBody = {}, options?: RequestOptions): Promise<Session> {
    return this.#http.jsonBody({ method: "PUT", path: sessionPath(sessionId), body: settings, options });
  }

  /** `GET /v1/sessions/{id}`: the session's turn, counts, calls and claims. */
  getSession(sessionId: string, options: GetSessionOptions = {}): Promise<SessionDetail> {
    const { delivered, after, limit } = options;
    const query = { delivered, after, limit };
    return this.#http.jsonBody({ method: "GET", path: sessionPath(sessionId), query, options });
  }

  /** `GET /v1/sessions`: one page of sessions in ascending id order, nested ones included. */
  listSessions(options: ListSessionsOptions = {}): Promise<SessionList> {
    const query = { limit: options.limit, after: options.after };
    return this.#http.jsonBody({ method: "GET", path: "/v1/sessions", query, options });
  }

  /** `POST /v1/sessions/{id}/turn`: `busy` while the session works, `idle` between turns (it is woken only while idle). */
  setTurn(sessionId: string, state: TurnState, options?: RequestOptions): Promise<TurnReply> {
    return this.#http.jsonBody({ method: "POST", path: `${sessionPath(sessionId)}/turn`, body: { state }, options });
  }

  // --- Delegation -----------------------------------------------------------------------------

  /**
   * `POST /v1/sessions/{id}/delegate`: starts a child per task. A background call answers its
   * units (202) and its results come at boundaries; a sync one, or a background one for a
   * session that is not wake-capable, answers the results (200, `results`).
   */
  delegate(sessionId: string, tasks: Task[], options: DelegateOptions = {}): Promise<Delegation> {
    const body: DelegateBody = compact({
      tasks,
      mode: options.mode,
      independent_completions: options.independentCompletions,
      traceparent: options.traceparent,
      idempotency_key: options.idempotencyKey,
    });
    return this.#http.jsonBody({ method: "POST", path: `${sessionPath(sessionId)}/delegate`, body, options });
  }

  /** `GET /v1/calls/{id}`: one call and its children, also once delivered. */
  getCall(callId: string, options?: RequestOptions): Promise<CallDetail> {
    return this.#http.jsonBody({ method: "GET", path: `/v1/calls/${segment(callId)}`, options });
  }

  // --- Boundaries and claims ------------------------------------------------------------------

  /**
   * `POST /v1/sessions/{id}/boundary`: claims the ready items as one envelope, or answers
   * `null` (204) when none is ready. Ack or release the claim within its lease.
   */
  boundary(sessionId: string, consumer: string, options: BoundaryOptions = {}): Promise<Envelope | null> {
    const body: BoundaryBody = compact({
      consumer,
      lease_ms: options.leaseMs,
      max_items: options.maxItems,
      max_bytes: options.maxBytes,
      ack: options.ack,
    });
    return this.#http.json({ method: "POST", path: `${sessionPath(sessionId)}/boundary`, body, options });
  }

  /** `POST /v1/claims/{id}/ack`: the envelope was delivered (acking again answers the same; a lost claim is 409 `claim_lost`). */
  ack(claimId: string, options?: RequestOptions): Promise<AckReply> {
    return this.#http.jsonBody({ method: "POST", path: `/v1/claims/${segment(claimId)}/ack`, options });
  }

  /** `POST /v1/claims/{id}/release`: hands the items back, `busy` (no attempt) or `failed` (an attempt, backed off). */
  release(claimId: string, reason: ReleaseReason, options: ReleaseOptions = {}): Promise<ReleaseReply> {
    const body = compact({ reason, retry_after_ms: options.retryAfterMs });
    return this.#http.jsonBody({ method: "POST", path: `/v1/claims/${segment(claimId)}/release`, body, options });
  }

  // --- Lifecycle ------------------------------------------------------------------------------

  /** `POST /v1/calls/{id}/cancel`: cancels every unfinished child of the call, nested ones included. */
  cancelCall(callId: string, options: CancelOptions = {}): Promise<CancelReply> {
    return this.#cancel(`/v1/calls/${segment(callId)}/cancel`, options);
  }

  /** `POST /v1/units/{id}/cancel`: cancels every unfinished child of the unit. */
  cancelUnit(unitId: string, options: CancelOptions = {}): Promise<CancelReply> {
    return this.#cancel(`/v1/units/${segment(unitId)}/cancel`, options);
  }

  /** `POST /v1/children/{id}/cancel`: cancels the child and its nested descendants. */
  cancelChild(childId: string, options: CancelOptions = {}): Promise<CancelReply> {
    return this.#cancel(`/v1/children/${segment(childId)}/cancel`, options);
  }

  #cancel(path: string, options: CancelOptions): Promise<CancelReply> {
    const body = options.reason === undefined ? undefined : { reason: options.reason };
    return this.#http.jsonBody({ method: "POST", path, body, options });
  }

  /** `GET /v1/dead-letters`: the items that ran out of delivery attempts, of one session or all. */
  deadLetters(options: RequestOptions & { sessionId?: string } = {}): Promise<DeadLetters> {
    const query = { session_id: options.sessionId };
    return this.#http.jsonBody({ method: "GET", path: "/v1/dead-letters", query, options });
  }

  /** `POST /v1/dead-letters/redrive`: makes dead letters ready again in their sessions. */
  redrive(selection: RedriveSelection, options?: RequestOptions): Promise<RedriveReply> {
    const body = compact({
      child_ids: "childIds" in selection ? selection.childIds : undefined,
      session_id: "sessionId" in selection ? selection.sessionId : undefined,
      all: "all" in selection ? selection.all : undefined,
      limit: selection.limit,
    });
    return this.#http.jsonBody({ method: "POST", path: "/v1/dead-letters/redrive", body, options });
  }

  // --- Events ---------------------------------------------------------------------------------

  /**
   * `GET /v1/sessions/{id}/events`: the session's events as they come, starting with a `ready`
   * event (seq 0) that gives the count ready now:
   *
   * ```ts
   * for await (const ev of brood.events("chat-1", { signal })) {
   *   if (ev.event === "ready" && ev.data.ready > 0) { ... }
   * }
   * ```
   *
   * It ends when `signal` aborts or the server ends the stream: after a `dropped` event (the
   * reader fell behind; read the session's state and listen again) or when the server stops.
   * `timeoutMs` bounds only the wait for the stream to open.
   */
  events(sessionId: string, options: RequestOptions = {}): AsyncGenerator<BroodEvent, void, undefined> {
    return streamEvents(this.#http, sessionId, options);
  }

  // --- External workers -----------------------------------------------------------------------

  /**
   * `POST /v1/workers/poll`: a child to run, or `null` (204) when none came within `waitMs`.
   * The request's time limit is `timeoutMs` beyond `waitMs`.
   */
  pollWork(options: PollOptions): Promise<WorkItem | null> {
    const body = compact({
      worker: options.worker,
      queue: options.queue,
      wait_ms: options.waitMs,
      lease_ms: options.leaseMs,
    });
    const extraTimeoutMs = options.waitMs ?? 0;
    return this.#http.json({ method: "POST", path: "/v1/workers/poll", body, options, extraTimeoutMs });
  }

  /** `POST /v1/children/{id}/heartbeat`: renews the child's lease; a stale token is 409. */
  heartbeat(childId: string, token: string, options: RequestOptions & { progress?: string } = {}): Promise<HeartbeatReply> {
    const body = compact({ token, progress: options.progress });
    return this.#http.jsonBody({ method: "POST", path: `${childPath(childId)}/heartbeat`, body, options });
  }

  /**
   * `POST /v1/children/{id}/complete`: the worker's outcome. The same completion sent again
   * answers the same (200); another one for an ended child is 409 `child_ended`, an unknown
   * token 409 `stale_token`.
   */
  complete(childId: string, token: string, completion: Completion, options?: RequestOptions): Promise<CompleteReply> {
    const body: CompleteBody = compact({ token, ...completion });
    return this.#http.jsonBody({ method: "POST", path: `${childPath(childId)}/complete`, body, options });
  }

  /** `POST /v1/workers/take`: hands out a listed child; between processes sharing a ledger, not for workers. */
  takeWork(body: TakeBody, options?: RequestOptions): Promise<WorkItem> {
    return this.#http.jsonBody({ method: "POST", path: "/v1/workers/take", body, options });
  }

  /** `POST /v1/workers/untake`: gives a take up; between processes sharing a ledger, not for workers. */
  async untakeWork(childId: string, takeId: string, options?: RequestOptions): Promise<void> {
    const body = { child_id: childId, take_id: takeId };
    await this.#http.json({ method: "POST", path: "/v1/workers/untake", body, options });
  }

  // --- Operations -----------------------------------------------------------------------------

  /** `GET /healthz`: liveness; a 503 `unhealthy` is thrown. */
  healthz(options?: RequestOptions): Promise<Health> {
    return this.#http.jsonBody({ method: "GET", path: "/healthz", options });
  }

  /** `GET /readyz`: whether the server admits work; a 503 (`draining`, `ledger_unavailable`) is thrown. */
  readyz(options?: RequestOptions): Promise<Readiness> {
    return this.#http.jsonBody({ method: "GET", path: "/readyz", options });
  }

  /** `GET /metrics`: the metrics in OpenMetrics text. */
  metrics(options?: RequestOptions): Promise<string> {
    return this.#http.text({ method: "GET", path: "/metrics", accept: "application/openmetrics-text, text/plain", options });
  }

  /** `GET /v1/openapi.json`: the OpenAPI 3.1 document of this server. */
  openapi(options?: RequestOptions): Promise<Record<string, unknown>> {
    return this.#http.jsonBody({ method: "GET", path: "/v1/openapi.json", options });
  }

  /** `GET /ui`: the live web view's HTML. */
  ui(options?: RequestOptions): Promise<string> {
    return this.#http.text({ method: "GET", path: "/ui", accept: "text/html", options });
  }
}

function sessionPath(sessionId: string): string {
  return `/v1/sessions/${segment(sessionId)}`;
}

function childPath(childId: string): string {
  return `/v1/children/${segment(childId)}`;
}
