#!/usr/bin/env python3
"""A parent agent driving `brood serve` over HTTP: delegate, keep working, be woken, collect.

The parent starts a tiny wake receiver (http.server on 127.0.0.1, a free port) in a thread,
opens its session with that receiver as its ``wake_url``, delegates a few ``sim`` children in
the background (one of them failing), "keeps working", and ends its turn (``idle``). Each wake
starts a turn: at its boundary the parent claims everything ready, prints the envelope's text,
acks the claim, and ends the turn again — until every child's result has arrived.

It exits 0 only if every child's result arrived exactly once (none missing, none twice), with
the status its runner was given; otherwise it prints what went wrong and exits 1.

    pip install ./clients/python
    python3 examples/python/parent_loop.py --url http://127.0.0.1:7070 [--api-key KEY]

The receiver is on loopback, which `brood serve` sends wakes to only when allowed: start the
server with ``--wake-allow 127.0.0.1``.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Dict, List, Tuple

from brood_client import BroodError, Client, SimRunner, Task

# (goal, sim ms, outcome, the status its result must carry)
CHILDREN: List[Tuple[str, int, str, str]] = [
    ("summarise the design notes", 50, "ok", "succeeded"),
    ("check the changelog", 120, "ok", "succeeded"),
    ("run the flaky suite", 80, "fail", "failed"),
    ("review PR 12", 300, "ok", "succeeded"),
]
WAKE_TIMEOUT_S = 20.0
CONSUMER = "parent-loop"


def start_wake_receiver() -> Tuple[ThreadingHTTPServer, "queue.Queue[Dict[str, Any]]"]:
    """A loopback HTTP server that puts every wake's JSON body on a queue and answers 200."""
    wakes: "queue.Queue[Dict[str, Any]]" = queue.Queue()

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (http.server's naming)
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()
            try:
                wakes.put(json.loads(raw))
            except ValueError:
                print(f"wake receiver: a body that is not JSON: {raw!r}", file=sys.stderr)

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, name="wake-receiver", daemon=True).start()
    return server, wakes


def run(client: Client) -> int:
    """The parent's life; answers the exit code."""
    receiver, wakes = start_wake_receiver()
    wake_url = f"http://127.0.0.1:{receiver.server_port}/wake"
    session_id = f"parent-{os.getpid()}-{int(time.time() * 1000)}"
    try:
        session = client.put_session(session_id, wake_url=wake_url)
        if not session.wake_capable:
            print(f"session {session_id} is not wake-capable: {session}", file=sys.stderr)
            return 1
        print(f"session {session_id} open, woken at {wake_url}")

        # A turn of our own: delegate in the background, then keep working.
        client.set_turn(session_id, "busy")
        tasks = [Task(goal, SimRunner(ms=ms, outcome=outcome)) for goal, ms, outcome, _ in CHILDREN]
        reply = client.delegate(session_id, tasks, mode="background", independent_completions=True)
        if reply.mode != "background":
            print(f"the call was not run in the background: {reply}", file=sys.stderr)
            return 1
        call_id = reply.call_id
        print(f"delegated {len(tasks)} children as {call_id} (set {reply.set}): {reply.note}")
        expected = {f"{call_id}.{i}": want for i, (_, _, _, want) in enumerate(CHILDREN)}
        for step in ("reading the codebase", "drafting the plan"):
            print(f"parent: keeps working — {step}")
            time.sleep(0.02)
        client.set_turn(session_id, "idle")
        print("parent: turn ended (idle), waiting to be woken")

        seen: Dict[str, str] = {}
        problems: List[str] = []
        woken = 0
        while len(seen) < len(expected):
            try:
                wake = wakes.get(timeout=WAKE_TIMEOUT_S)
            except queue.Empty:
                missing = sorted(set(expected) - set(seen))
                problems.append(f"no wake in {WAKE_TIMEOUT_S:.0f} s; still missing {missing}")
                break
            woken += 1
            print(f"woken ({wake.get('ready')} ready)")
            client.set_turn(session_id, "busy")
            collect(client, session_id, expected, seen, problems)
            client.set_turn(session_id, "idle")

        # Nothing may be left over, nor arrive twice later.
        leftover = client.boundary(session_id, consumer=CONSUMER)
        if leftover is not None:
            problems.append(f"items still ready after every result arrived: {leftover.items}")
            client.release(leftover.claim_id, "busy")
        for child_id, want in expected.items():
            got = seen.get(child_id)
            if got is None:
                problems.append(f"{child_id}: no result arrived")
            elif got != want:
                problems.append(f"{child_id}: status {got}, expected {want}")
        if problems:
            for p in problems:
                print(f"FAILED: {p}", file=sys.stderr)
            return 1
        print(f"all {len(expected)} results arrived exactly once, in {woken} wake(s)")
        return 0
    except BroodError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        receiver.shutdown()
        receiver.server_close()


def collect(
    client: Client,
    session_id: str,
    expected: Dict[str, str],
    seen: Dict[str, str],
    problems: List[str],
) -> None:
    """At a boundary: claims everything ready, envelope after envelope, prints and acks each."""
    while True:
        envelope = client.boundary(session_id, consumer=CONSUMER, lease_ms=30_000)
        if envelope is None:
            return
        print(envelope.text)
        for item in envelope.items:
            if item.kind != "result":
                continue  # a failure notice ahead of its unit's results: not a result
            child_id = item.child_id
            if child_id not in expected:
                problems.append(f"a result of a child this parent never delegated: {child_id}")
            elif child_id in seen:
                problems.append(f"{child_id}: its result arrived twice")
            seen[child_id] = item.status
        acked = client.ack(envelope.claim_id)
        print(f"acked {envelope.claim_id}: {acked.delivered} delivered")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:7070", help="the brood server (default %(default)s)")
    parser.add_argument("--api-key", default=None, help="the server's key, if it has one")
    args = parser.parse_args()
    with Client(args.url, api_key=args.api_key, timeout=30) as client:
        return run(client)


if __name__ == "__main__":
    sys.exit(main())
