/**
 * A client of brood's HTTP API, version 1: {@link Client} (one method per operation),
 * {@link Worker} (the kit for external workers), the typed event stream, and the API's shapes.
 */

export {
  Client,
  type BoundaryOptions,
  type CancelOptions,
  type ClientOptions,
  type Completion,
  type DelegateOptions,
  type GetSessionOptions,
  type ListSessionsOptions,
  type PollOptions,
  type RedriveSelection,
  type ReleaseOptions,
} from "./client.js";
export { BroodError, type ClientErrorCode } from "./errors.js";
export { eventOf } from "./events.js";
export type { RequestOptions } from "./http.js";
export { command, external, sim } from "./runners.js";
export { parseSse, type SseFrame } from "./sse.js";
export type * from "./types.js";
export type { components, operations, paths } from "./schema.js";
export {
  Worker,
  type Handler,
  type HandlerResult,
  type RunOptions,
  type WorkContext,
  type WorkerOptions,
  type WorkResult,
} from "./worker.js";
