/**
 * The shapes of the API by name: each one the OpenAPI document's (`schema.ts`, generated from
 * `openapi.json`), with the fields the server is gaining (task `input` and `retry`, worker
 * `output`, results' `output` and `attempts`, idempotent delegates, bounded envelopes) added as
 * optional while the document lacks them. Once the document has a field, its own type is the
 * one used, so these names cannot drift from what the server states.
 */

import type { components, paths } from "./schema.js";

type Schemas = components["schemas"];

/** Any JSON value. */
export type Json = null | boolean | number | string | Json[] | { [key: string]: Json };

/**
 * `Base` with the fields of `Extra` it does not have yet, optional: the document's type once
 * it has them all.
 */
export type Pending<Base, Extra> = Base & { [K in Exclude<keyof Extra, keyof Base>]?: Extra[K] };

// --- Requests ---------------------------------------------------------------------------------

/** A task's retry policy: a child that ends `failed` or `timed_out` is run again before its result is published. */
export interface RetryPolicy {
  /** Executions at most, from 1 to 20 (default 1). */
  max_attempts?: number;
  /** The wait before the first retry, in ms. */
  backoff_ms?: number;
  /** The longest wait between two attempts, in ms. */
  max_backoff_ms?: number;
}

/** A `sim` runner spec. */
export type SimRunner = Schemas["SimRunner"];
/**
 * A `command` runner spec. (`argv` is retyped: the document states a non-empty program as
 * `prefixItems` beside `items`, which the generator reads as a one-element tuple.)
 */
export type CommandRunner = Omit<Schemas["CommandRunner"], "argv"> & { argv: Schemas["CommandArg"][] };
/** How a child runs: `sim`, `command` or `external` (see `runners.ts`). */
export type Runner = Exclude<Schemas["Runner"], Schemas["CommandRunner"]> | CommandRunner;
/** An `external` runner spec. */
export type ExternalRunner = Schemas["ExternalRunner"];

/** One task of a delegation: `goal` and `runner` required. */
export type Task = Pending<
  Omit<Schemas["TaskBody"], "runner"> & { runner: Runner },
  {
    /** Data for the child: any JSON (`null` = none), at most `max_input_bytes` encoded. */
    input: Json;
    /** Run it again when it fails or times out. */
    retry: RetryPolicy;
  }
>;

/** The body of `POST /v1/sessions/{id}/delegate`. */
export type DelegateBody = Pending<
  Omit<Schemas["DelegateBody"], "tasks"> & { tasks: Task[] },
  {
    /** A retry with the same key and body answers the first call's reply. */
    idempotency_key: string;
  }
>;

/** The body of `POST /v1/sessions/{id}/boundary`. */
export type BoundaryBody = Pending<
  Schemas["BoundaryBody"],
  {
    /** Items at most in the envelope (at least one is always handed out when any is ready). */
    max_items: number;
    /** Bytes at most of the envelope's items. */
    max_bytes: number;
  }
>;

/** The body of `POST /v1/children/{id}/complete`. */
export type CompleteBody = Pending<
  Schemas["CompleteBody"],
  {
    /** The child's output: any JSON, at most `max_output_bytes` encoded. */
    output: Json;
  }
>;

/** The body of `PUT /v1/sessions/{id}`. */
export type PutSessionBody = Schemas["PutSession"];
/** The body of `POST /v1/dead-letters/redrive`. */
export type RedriveBody = Schemas["RedriveBody"];
/** The body of `POST /v1/workers/take` (between processes sharing a ledger). */
export type TakeBody = Schemas["TakeBody"];
/** A session's turn: `busy` or `idle`. */
export type TurnState = Schemas["Turn"];
/** Why a claim is released: `busy` or `failed`. */
export type ReleaseReason = Schemas["ReleaseReason"];
/** How a worker's child ended: `succeeded` or `failed`. */
export type Ended = Schemas["Ended"];

// --- Replies ----------------------------------------------------------------------------------

/** What results gain: the child's output and the execution attempts made. */
interface ResultData {
  /** The child's output (JSON), or `null`. */
  output: Json;
  /** Execution attempts made (retries included). */
  attempts: number;
}

/** One item of an envelope or of a sync delegate's results. */
export type Item = Pending<Schemas["Item"], ResultData>;

/** A claim of ready items, from `POST /v1/sessions/{id}/boundary`. */
export type Envelope = Pending<
  Omit<Schemas["Envelope"], "items"> & { items: Item[] },
  {
    /** Ready items were left for the next boundary. */
    more: boolean;
  }
>;

/** A background delegate's reply (202). */
export type DelegateBackground = Schemas["DelegateBackground"];
/** A sync delegate's reply (200), also a background one forced to sync. */
export type DelegateSync = Omit<Schemas["DelegateSync"], "results"> & { results: Item[] };
/** A delegate's reply. */
export type Delegation = DelegateBackground | DelegateSync;

/** A child of a call. */
export type ChildView = Pending<Schemas["ChildView"], ResultData>;
/** A call on its own, from `GET /v1/calls/{id}`. */
export type CallDetail = Omit<Schemas["CallDetail"], "children"> & { children: ChildView[] };
/** A call as a session shows it. */
export type CallView = Omit<Schemas["CallView"], "children"> & { children: ChildView[] };
/** A session's whole state, from `GET /v1/sessions/{id}`. */
export type SessionDetail = Omit<Schemas["SessionDetail"], "calls"> & { calls: CallView[] };

/** A child handed to an external worker. */
export type WorkItem = Pending<
  Schemas["WorkItem"],
  {
    /** The task's input, or `null`. */
    input: Json;
    /** The session the child works for. */
    session_id: string;
    /** The child's call. */
    call_id: string;
    /** The execution attempt, 1 for the first run. */
    attempt: number;
    /** When the child times out (ms since the epoch), or `null`. */
    deadline_at: number | null;
  }
>;

/** A completion's reply. */
export type CompleteReply = Pending<Schemas["CompleteReply"], { output: Json }>;

/** A session's settings, from `PUT /v1/sessions/{id}`. */
export type Session = Schemas["Session"];
/** A session's counts of children and items. */
export type Counts = Schemas["Counts"];
/** A page of `GET /v1/sessions`. */
export type SessionList = Schemas["SessionList"];
/** The reply of `POST /v1/sessions/{id}/turn`. */
export type TurnReply = Schemas["TurnReply"];
/** The reply of an ack. */
export type AckReply = Schemas["AckReply"];
/** The reply of a release. */
export type ReleaseReply = Schemas["ReleaseReply"];
/** The reply of a cancel. */
export type CancelReply = Schemas["CancelReply"];
/** An item that ran out of delivery attempts. */
export type DeadLetter = Schemas["DeadLetter"];
/** The reply of `GET /v1/dead-letters`. */
export type DeadLetters = Schemas["DeadLetters"];
/** The reply of a redrive. */
export type RedriveReply = Schemas["RedriveReply"];
/** The reply of a heartbeat. */
export type HeartbeatReply = Schemas["HeartbeatReply"];
/** The reply of `GET /healthz`. */
export type Health = Schemas["Health"];
/** The error reply of every refusal. */
export type ErrorReply = Schemas["ErrorReply"];

/**
 * The reply of `GET /readyz`: the document's once it describes the operation, any JSON
 * object until then.
 */
export type Readiness = paths extends {
  "/readyz": { get: { responses: { 200: { content: { "application/json": infer R } } } } };
}
  ? R
  : { [key: string]: Json };

// --- Events -----------------------------------------------------------------------------------

/** The name of an event of a session's stream. */
export type EventName = Schemas["EventName"];

/** The `data` of each event, by name. */
export interface EventBodies {
  child: Pending<Schemas["ChildEvent"], Partial<ResultData>>;
  ready: Schemas["ReadyEvent"];
  wake: Schemas["ReadyEvent"];
  failure_notice: Schemas["FailureNoticeEvent"];
  claim: Schemas["ClaimEvent"];
  cancel: Schemas["CancelEvent"];
  dropped: Schemas["DroppedEvent"];
}

/**
 * One event of a session's stream: narrow on `event` to get its `data`'s type. `id` is its
 * sequence number as text (none on `dropped`).
 */
export type BroodEvent = {
  [N in EventName]: { event: N; id: string | undefined; data: EventBodies[N] };
}[EventName];
