/**
 * The holder hint (`followHolder: true`): with several `brood serve` processes on one database,
 * an answer about one session names the process serving it in `X-Brood-Holder`. A client that
 * follows the hint sends that session's next requests there, sparing each a hop between
 * processes. Here: where each session was last said to be, and which failures of a hinted
 * address send the request to the base URL again. Nothing here does I/O.
 */

/** The header naming the process that serves the session an answer is about. */
export const HOLDER = "x-brood-holder";

/** The most sessions whose holder is remembered; the least recently told is forgotten first. */
export const REMEMBERED = 10_000;

/**
 * The session a request path is about: `/v1/sessions/{id}…`, or `/v1/claims/{id}…` whose
 * claim id names its session (`clm_<session id as hex>_<hex>`); `undefined` for any other path.
 */
export function sessionOf(path: string): string | undefined {
  const parts = path.split("/");
  if (parts.length < 4 || parts[0] !== "" || parts[1] !== "v1" || !parts[3]) {
    return undefined;
  }
  let id: string;
  try {
    id = decodeURIComponent(parts[3]);
  } catch {
    return undefined;
  }
  if (parts[2] === "sessions") {
    return id;
  }
  if (parts[2] === "claims") {
    return claimSession(id);
  }
  return undefined;
}

/** The session a claim id names, or `undefined` when it is not one of brood's. */
export function claimSession(claimId: string): string | undefined {
  if (!claimId.startsWith("clm_")) {
    return undefined;
  }
  const rest = claimId.slice("clm_".length);
  const cut = rest.lastIndexOf("_");
  const hex = cut < 0 ? "" : rest.slice(0, cut);
  if (cut < 0 || hex.length % 2 !== 0 || !/^[0-9a-fA-F]*$/.test(hex)) {
    return undefined;
  }
  const bytes = new Uint8Array(hex.length / 2);
  for (let i = 0; i < bytes.length; i++) {
    bytes[i] = parseInt(hex.slice(2 * i, 2 * i + 2), 16);
  }
  try {
    return new TextDecoder("utf-8", { fatal: true }).decode(bytes);
  } catch {
    return undefined;
  }
}

/**
 * The root a hint names (`scheme://host:port`), or `undefined` unless it is a plain `http://`
 * or `https://` address.
 */
export function holderAddress(value: string | null | undefined): string | undefined {
  if (!value) {
    return undefined;
  }
  let url: URL;
  try {
    url = new URL(value.trim());
  } catch {
    return undefined;
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    return undefined;
  }
  if (url.host === "" || url.username !== "" || url.password !== "" || url.pathname !== "/") {
    return undefined;
  }
  if (url.search !== "" || url.hash !== "") {
    return undefined;
  }
  return url.origin;
}

/**
 * Whether a `fetch` to a hinted address that threw `error` is sent again to the base URL: only
 * when no connection was made, so the request cannot have reached a process. (After the time
 * limit, or a connection lost mid-way, it may have; that error is thrown, and the next request
 * goes to the base URL.)
 */
export function resendAtBase(error: unknown): boolean {
  const codes = new Set([
    "ECONNREFUSED",
    "EHOSTUNREACH",
    "ENETUNREACH",
    "EADDRNOTAVAIL",
    "ENOTFOUND",
    "EAI_AGAIN",
    "UND_ERR_CONNECT_TIMEOUT",
  ]);
  for (let e: unknown = error, depth = 0; e instanceof Error && depth < 4; e = e.cause, depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && codes.has(code)) {
      return true;
    }
    // Several addresses tried (a name with an IPv4 and an IPv6 one): each refused.
    const errors = (e as { errors?: unknown }).errors;
    if (Array.isArray(errors) && errors.length > 0 && errors.every((x) => resendAtBase(x))) {
      return true;
    }
  }
  return false;
}

/** Where each session's holder is, as the last answer about the session named it. */
export class Holders {
  readonly #at = new Map<string, string>();

  /** The root to send a request for `path` to, when its session's holder is known. */
  root(path: string): string | undefined {
    const session = sessionOf(path);
    return session === undefined ? undefined : this.#at.get(session);
  }

  /** Forgets the holder of the session `path` is about. */
  forget(path: string): void {
    const session = sessionOf(path);
    if (session !== undefined) {
      this.#at.delete(session);
    }
  }

  /**
   * Remembers the holder the answer to a request for `path` named; forgets it after a 503 (the
   * process is not serving the session, or not now) or an answer that names none.
   */
  learn(path: string, response: { status: number; headers: { get(name: string): string | null } }): void {
    const session = sessionOf(path);
    if (session === undefined) {
      return;
    }
    const root = response.status === 503 ? undefined : holderAddress(response.headers.get(HOLDER));
    this.#at.delete(session);
    if (root === undefined) {
      return;
    }
    this.#at.set(session, root);
    if (this.#at.size > REMEMBERED) {
      const oldest = this.#at.keys().next().value;
      if (oldest !== undefined) {
        this.#at.delete(oldest);
      }
    }
  }

  /** How many sessions' holders are remembered. */
  get size(): number {
    return this.#at.size;
  }
}
