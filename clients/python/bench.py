#!/usr/bin/env python3
"""End-to-end throughput of the blocking client: delegate N zero-time ``sim`` children, then
claim and ack at boundaries until every result was delivered; prints children per second.

    python clients/python/bench.py --bin target/release/brood [--children 1000] [--repeat 3]
    python clients/python/bench.py --url http://127.0.0.1:7070

With ``--bin`` it starts that brood on a free loopback port over a temporary data folder (and
stops it after); with ``--url`` it uses a running server without a key. Children are delegated
in calls of at most ``--per-call`` tasks, each its own unit (``independent_completions``) unless
``--one-unit``, so results come out as they end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Iterator, List

import httpx

from brood_client import Client, SimRunner, Task


@contextlib.contextmanager
def started(binary: str) -> Iterator[str]:
    """``brood serve`` from ``binary`` on a free port; yields its URL."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory(prefix="brood-bench-") as data:
        env = {k: v for k, v in os.environ.items() if not k.startswith("BROOD_")}
        process = subprocess.Popen([binary, "serve", "--listen", f"127.0.0.1:{port}", "--data-dir", data],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                        break
                if process.poll() is not None or time.monotonic() > deadline:
                    sys.exit(f"{binary} did not start")
                time.sleep(0.05)
            yield url
        finally:
            process.terminate()
            process.wait(timeout=30)


def round_trip(client: Client, children: int, per_call: int, independent: bool) -> float:
    """Seconds from the first delegate until every result was acked."""
    session_id = f"bench-{uuid.uuid4().hex[:12]}"
    client.put_session(session_id, addressable=True, max_concurrent_children=64)
    tasks = [Task(f"t{i}", SimRunner(ms=0)) for i in range(children)]
    begun = time.perf_counter()
    for start in range(0, children, per_call):
        client.delegate(session_id, tasks[start:start + per_call], independent_completions=independent)
    delivered, seen = 0, set()
    while delivered < children:
        envelope = client.boundary(session_id, "bench")
        if envelope is None:
            time.sleep(0.001)
            continue
        seen.update(item.child_id for item in envelope.items)
        delivered += client.ack(envelope.claim_id).delivered
    elapsed = time.perf_counter() - begun
    if len(seen) != children or delivered != children:
        sys.exit(f"delivered {delivered}, {len(seen)} distinct, of {children} children")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--bin", help="a brood binary to start")
    where.add_argument("--url", help="a running brood server without a key")
    parser.add_argument("--children", type=int, default=1000)
    parser.add_argument("--per-call", type=int, default=1000,
                        help="tasks per delegate (the server's max_tasks_per_call bounds it)")
    parser.add_argument("--one-unit", action="store_true", help="one unit per call: its results go out together")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()

    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(started(args.bin))
        client = stack.enter_context(Client(url, timeout=60))
        rates: List[float] = []
        for _ in range(args.repeat):
            elapsed = round_trip(client, args.children, args.per_call, not args.one_unit)
            rates.append(args.children / elapsed)
            print(f"{args.children} children delegated, claimed and acked in {elapsed:.3f} s: "
                  f"{rates[-1]:.0f} children/s")
        print(f"best {max(rates):.0f} children/s, median {sorted(rates)[len(rates) // 2]:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
