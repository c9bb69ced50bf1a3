/**
 * A session's event stream (`GET /v1/sessions/{id}/events`) as an async iterator of typed
 * events.
 */

import { BroodError } from "./errors.js";
import { segment, type Opened, type RequestOptions, type Transport } from "./http.js";
import { parseSse, type SseFrame } from "./sse.js";
import type { BroodEvent, EventName } from "./types.js";

/** Every event name the document states; a name missing here fails to compile. */
const EVENT_NAMES: Record<EventName, true> = {
  child: true,
  ready: true,
  wake: true,
  failure_notice: true,
  claim: true,
  cancel: true,
  dropped: true,
};

function isEventName(name: string): name is EventName {
  return Object.hasOwn(EVENT_NAMES, name);
}

/**
 * The typed event of a frame, or `undefined` for an event this client does not know (a newer
 * server's); its data must be JSON.
 */
export function eventOf(frame: SseFrame): BroodEvent | undefined {
  if (!isEventName(frame.event)) {
    return undefined;
  }
  let data: unknown;
  try {
    data = JSON.parse(frame.data);
  } catch (e) {
    throw new BroodError(0, "bad_reply", `the ${frame.event} event's data is not JSON: ${e}`);
  }
  return { event: frame.event, id: frame.id, data } as BroodEvent;
}

/**
 * The events of `sessionId` as they come. `options.timeoutMs` bounds the wait for the stream
 * to open, not the stream. The iteration ends when the server ends the stream (after a
 * `dropped` event, or when it stops) or when `options.signal` aborts; leaving the loop closes
 * the connection.
 */
export async function* streamEvents(
  transport: Transport,
  sessionId: string,
  options: RequestOptions = {},
): AsyncGenerator<BroodEvent, void, undefined> {
  let opened: Opened;
  try {
    opened = await transport.open({
      method: "GET",
      path: `/v1/sessions/${segment(sessionId)}/events`,
      accept: "text/event-stream",
      options,
    });
  } catch (e) {
    if (options.signal?.aborted) {
      return;
    }
    throw e;
  }
  opened.endTimeLimit();
  const body = opened.response.body;
  try {
    if (body === null) {
      return;
    }
    for await (const frame of parseSse(chunks(body))) {
      // Frames already read are not handed out once the caller has stopped listening.
      if (options.signal?.aborted) {
        return;
      }
      const event = eventOf(frame);
      if (event !== undefined) {
        yield event;
      }
    }
  } catch (e) {
    if (options.signal?.aborted) {
      return;
    }
    throw e instanceof BroodError ? e : opened.failure(e);
  } finally {
    opened.close();
  }
}

/** The chunks of a body; the stream is cancelled (the connection closed) when the reading stops. */
async function* chunks(body: ReadableStream<Uint8Array>): AsyncGenerator<Uint8Array> {
  const reader = body.getReader();
  try {
    for (;;) {
      const { done, value } = await reader.read();
      if (done) {
        return;
      }
      yield value;
    }
  } finally {
    await reader.cancel().catch(() => undefined);
  }
}
