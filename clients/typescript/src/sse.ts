/**
 * The `text/event-stream` format: frames from a stream of bytes.
 */

/** One server-sent event as framed: its name, its data, and its `id:` when it had one. */
export interface SseFrame {
  /** The `event:` field; `message` when the frame named none. */
  event: string;
  /** The `data:` lines, joined with newlines. */
  data: string;
  /** This frame's `id:` field; `undefined` when it had none. */
  id: string | undefined;
}

/**
 * The frames of an event stream, as its chunks arrive: `event:`, `data:` and `id:` fields, a
 * blank line ending each frame, `:` comments (keep-alives) and unknown fields skipped, lines
 * ended by CRLF, LF or CR. A frame without data is not an event and is dropped, as the format
 * says; so is an unfinished frame at the end of the stream.
 */
export async function* parseSse(chunks: AsyncIterable<Uint8Array>): AsyncGenerator<SseFrame> {
  const decoder = new TextDecoder();
  const frame = new FrameBuilder();
  let buffer = "";
  // A CR at the end of the buffer may be the first half of a CRLF: it waits for the next chunk.
  const lineEnd = /\r\n|\r(?=[^\n])|\n/g;
  for await (const chunk of chunks) {
    buffer += decoder.decode(chunk, { stream: true });
    let start = 0;
    lineEnd.lastIndex = 0;
    for (let m = lineEnd.exec(buffer); m !== null; m = lineEnd.exec(buffer)) {
      const done = frame.line(buffer.slice(start, m.index));
      start = m.index + m[0].length;
      if (done) {
        yield done;
      }
    }
    buffer = buffer.slice(start);
  }
  buffer += decoder.decode();
  // What is left may end in that CR; whatever follows it is a frame never ended by a blank line.
  if (buffer.endsWith("\r")) {
    const done = frame.line(buffer.slice(0, -1));
    if (done) {
      yield done;
    }
  }
}

/** Collects one frame's fields, line by line. */
class FrameBuilder {
  #event = "";
  #data: string[] = [];
  #id: string | undefined;

  /** Takes one line; answers the frame that a blank line ended, if it had data. */
  line(line: string): SseFrame | undefined {
    if (line === "") {
      const done =
        this.#data.length > 0 ? { event: this.#event || "message", data: this.#data.join("\n"), id: this.#id } : undefined;
      this.#event = "";
      this.#data = [];
      this.#id = undefined;
      return done;
    }
    if (line.startsWith(":")) {
      return undefined;
    }
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) {
      value = value.slice(1);
    }
    switch (field) {
      case "event":
        this.#event = value;
        break;
      case "data":
        this.#data.push(value);
        break;
      case "id":
        this.#id = value;
        break;
      default:
      // `retry:` and unknown fields are ignored, as the format says.
    }
    return undefined;
  }
}
