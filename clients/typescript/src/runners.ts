/**
 * Runner specs, the `runner` of a task.
 */

import { compact } from "./http.js";
import type { CommandRunner, ExternalRunner, SimRunner } from "./types.js";

/** A `sim` runner: works `ms` milliseconds, then ends as `outcome` says (default `ok`). */
export function sim(options: Omit<SimRunner, "kind"> = {}): SimRunner {
  return compact({ kind: "sim", ...options });
}

/** A `command` runner: runs `argv` (refused with 403 unless the server allows commands). */
export function command(argv: string[], options: Omit<CommandRunner, "kind" | "argv"> = {}): CommandRunner {
  return compact({ kind: "command", argv, ...options });
}

/** An `external` runner: an outside worker polls `queue` (default `default`) for the child. */
export function external(queue?: string): ExternalRunner {
  return compact({ kind: "external", queue });
}
