/**
 * The one error type of the client: an error reply of the server, or no usable reply at all.
 */

/**
 * The codes the client makes up itself, when the server gave no error body to read one from.
 *
 * - `connection_failed`: the server could not be reached, or the connection broke;
 * - `timeout`: no reply within the request's time;
 * - `aborted`: the caller's `AbortSignal` ended the request;
 * - `bad_reply`: a success whose body is not what the API answers (not JSON, or none).
 *
 * An error reply whose body is not the API's `{"error": {"code", "message"}}` gets the code
 * `http_<status>`.
 */
export type ClientErrorCode = "connection_failed" | "timeout" | "aborted" | "bad_reply";

/**
 * A failed request. `status` is the HTTP status (0 when no reply came), `code` the API's
 * snake_case code (`invalid_request`, `unknown_session`, `claim_lost`, … or one of
 * {@link ClientErrorCode}), `message` what is wrong as the server (or the client) says it.
 */
export class BroodError extends Error {
  override readonly name = "BroodError";
  readonly status: number;
  readonly code: string;

  constructor(status: number, code: string, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.status = status;
    this.code = code;
  }

  /** Whether the same request may succeed later: no reply came, or the server asked to try again. */
  get transient(): boolean {
    return (
      (this.status === 0 && this.code !== "aborted") ||
      this.status === 408 ||
      this.status === 429 ||
      this.status >= 500
    );
  }

  override toString(): string {
    return `BroodError: ${this.status} ${this.code}: ${this.message}`;
  }
}

/**
 * The error of a reply with status `status` and body `text`: the API's error shape, or an
 * `http_<status>` code carrying the text when the body is not in that shape.
 */
export function errorOfReply(status: number, text: string): BroodError {
  try {
    const body: unknown = JSON.parse(text);
    const error = (body as { error?: { code?: unknown; message?: unknown } } | null)?.error;
    if (typeof error?.code === "string" && typeof error.message === "string") {
      return new BroodError(status, error.code, error.message);
    }
  } catch {
    // Not JSON: reported below with the text itself.
  }
  const shown = text.trim() || `the server answered ${status} with no body`;
  return new BroodError(status, `http_${status}`, shown);
}
